package manifest

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/store"
)

// FuzzManifest feeds arbitrary bytes to the manifest.json decoder: it must
// return a manifest or an error, never panic, and whatever it accepts must
// hold only well-formed digests and paths.
func FuzzManifest(f *testing.F) {
	f.Add([]byte(`{"version":1,"records":{},"pipelines":{},"blobs":{}}`))
	f.Add([]byte(`{"version":1,"records":{"k":{"key":"k","outputs":[{"path":"a/b","digest":"sha256:` +
		"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" + `","size":3}]}}}`))
	f.Add([]byte(`{"version":1,"records":{"k":null}}`))
	// Format 1 is converted when decoded: an import (sources) and a stage
	// reading it.
	f.Add([]byte(`{"version":1,"records":{"i":{"key":"i","kind":"import","params":{"path":"/m","copy":true},` +
		`"sources":{"/m/a":{"size":1}},"outputs":[{"path":"a","digest":"sha256:` +
		"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" + `","size":1}]},` +
		`"g":{"key":"g","kind":"gguf","params":{"from":"i"},"inputs":[{"stage":"i","key":"i","digest":"sha256:` +
		"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" + `"}],"outputs":[]}},"pipelines":{"p":{"i":"i","g":"g"}}}`))
	f.Add([]byte(`{"version":2,"records":{}}`))
	f.Add([]byte(`{"version":3,"records":{},"pipelines":{"p":{"i":"i"}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeManifest(bytes.NewReader(b))
		if err != nil {
			return
		}
		for k, r := range m.Records {
			if r.Key != k {
				t.Fatalf("record %q has key %q", k, r.Key)
			}
			for _, o := range r.Outputs {
				if o.Digest.Validate() != nil || checkRelPath(o.Path) != nil || o.Size < 0 {
					t.Fatalf("accepted bad output %+v", o)
				}
			}
		}
	})
}

// FuzzJournal opens a resume journal whose file holds arbitrary bytes (and a
// data file of arbitrary length): opening must never panic, the resumed
// state must be consistent (offset = last unit's end, not past the data),
// and finishing the output must give the digest of the bytes in the blob.
func FuzzJournal(f *testing.F) {
	f.Add([]byte("{\"ref\":\"out.bin\"}\n"), uint16(0))
	f.Add([]byte("{\"ref\":\"out.bin\"}\n{\"unit\":\"u0\",\"end\":3,\"state\":\"AAAA\"}\n"), uint16(3))
	f.Add([]byte("{\"ref\":\"out.bin\"}\n{\"unit\":\"u0\",\"end\":3,\"sta"), uint16(10))
	f.Add([]byte("{\"ref\":\"other\"}\n"), uint16(5))
	f.Fuzz(func(t *testing.T, journal []byte, dataLen uint16) {
		s, err := Open(filepath.Join(t.TempDir(), "s"))
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(s.IngestDir("k"), DigestOf([]byte("out.bin")).Short())
		os.MkdirAll(dir, 0o755)
		os.WriteFile(filepath.Join(dir, "journal"), journal, 0o644)
		os.WriteFile(filepath.Join(dir, "data"), bytes.Repeat([]byte{7}, int(dataLen)), 0o644)
		j, err := s.OpenJournal("k", "out.bin")
		if err != nil {
			return
		}
		defer j.Close()
		if _, ok := j.Committed(); ok {
			return
		}
		units := j.Units()
		var end int64
		if len(units) > 0 {
			end = units[len(units)-1].End
		}
		if j.Offset() != end || end > int64(dataLen) {
			t.Fatalf("offset %d, last unit end %d, data %d", j.Offset(), end, dataLen)
		}
		j.Write([]byte("tail"))
		j.EndUnit("tail")
		o, err := j.Commit(-1)
		if err != nil {
			return // a restored hash state that does not unmarshal is reset, not an error; other errors are I/O
		}
		b, err := os.ReadFile(s.BlobPath(o.Digest))
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(b)) != o.Size {
			t.Fatalf("blob %d bytes, output says %d", len(b), o.Size)
		}
	})
}

// FuzzRecordObject feeds arbitrary record objects (records/<key>.json, its
// meta included) to FromStoreRecord: a record or an error, never a panic,
// and only well-formed outputs accepted; what it accepts goes back to the
// same store record.
func FuzzRecordObject(f *testing.F) {
	f.Add([]byte(`{"key":"k","outputs":[{"path":"a/b","digest":"sha256:` +
		"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" + `","size":3}],"host":"gpu",` +
		`"meta":{"pipeline":"p","stage":"s","kind":"gguf","kind_version":"1","params":{"from":"m"},` +
		`"inputs":[{"stage":"m","key":"m1","digest":"sha256:` + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" + `"}],` +
		`"started":"2026-11-27T10:00:00Z","finished":"2026-11-27T10:01:00Z"}}`))
	f.Add([]byte(`{"key":"k","outputs":[{"path":"../x","digest":"sha256:00","size":-1}],"meta":[]}`))
	f.Add([]byte(`{"key":"k","outputs":[],"meta":{"params":null}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var srec store.Record
		if json.Unmarshal(b, &srec) != nil {
			return
		}
		rec, err := FromStoreRecord("fuzz", &srec)
		if err != nil {
			return
		}
		for _, o := range rec.Outputs {
			if o.Digest.Validate() != nil || checkRelPath(o.Path) != nil || o.Size < 0 {
				t.Fatalf("accepted bad output %+v", o)
			}
		}
		back, err := ToStoreRecord(rec)
		if err != nil {
			t.Fatalf("accepted record does not marshal back: %v", err)
		}
		if back.Key != srec.Key || len(back.Outputs) != len(srec.Outputs) || back.Host != srec.Host {
			t.Fatalf("round trip: %+v, from %+v", back, srec)
		}
	})
}
