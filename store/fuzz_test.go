package store

import (
	"encoding/json"
	"testing"
)

// A record read from shared storage is untrusted: whatever its bytes,
// decodeRecord returns an error or a record whose digests and sizes are
// valid, and which encodes and decodes again to itself.
func FuzzRecord(f *testing.F) {
	for _, s := range []string{
		`{"key":"k","outputs":[{"path":"a","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000","size":3}],"host":"h","meta":{"x":1}}`,
		`{"key":"k","outputs":[]}`,
		`{"key":"k","outputs":[{"path":"","digest":"sha256:00","size":-1}]}`,
		`{"key":"k","outputs":null,"extra":1}`,
		`{"key":"k"} {"key":"j"}`,
		`[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRecord(b)
		if err != nil {
			return
		}
		for _, o := range r.Outputs {
			if o.Digest.Validate() != nil || o.Size < 0 || o.Path == "" {
				t.Fatalf("accepted output %+v", o)
			}
		}
		again, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := decodeRecord(again)
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v\n%s", err, again)
		}
		if r2.Key != r.Key || len(r2.Outputs) != len(r.Outputs) || r2.Host != r.Host {
			t.Fatalf("round trip changed the record: %+v vs %+v", r, r2)
		}
	})
}
