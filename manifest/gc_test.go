package manifest

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// GC keeps what an unfinished stage resumes from (its journal and its work
// dir) unless asked to drop it; ingest temp files always go.
func TestGCKeepsResumeState(t *testing.T) {
	for _, journals := range []bool{false, true} {
		s := openTemp(t)
		j, err := s.OpenJournal("k", "big.bin")
		if err != nil {
			t.Fatal(err)
		}
		j.Write([]byte("unit zero"))
		if err := j.EndUnit("u0"); err != nil {
			t.Fatal(err)
		}
		j.Close()
		work := filepath.Join(s.WorkDir("k"), "half-done.safetensors")
		if err := os.MkdirAll(filepath.Dir(work), 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(work, []byte("x"), 0o644)
		tmp := filepath.Join(s.Root, "tmp", "ingest-1.partial")
		os.WriteFile(tmp, []byte("x"), 0o644)

		if _, err := s.GC(journals); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(tmp); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("journals=%v: temp file kept", journals)
		}
		_, werr := os.Stat(work)
		j, err = s.OpenJournal("k", "big.bin")
		if err != nil {
			t.Fatal(err)
		}
		units := len(j.Units())
		j.Close()
		if journals {
			if werr == nil || units != 0 {
				t.Errorf("gc --journals kept the resume state (work dir err %v, %d journal units)", werr, units)
			}
		} else if werr != nil || units != 1 {
			t.Errorf("gc dropped the resume state (work dir err %v, %d journal units)", werr, units)
		}
	}
}
