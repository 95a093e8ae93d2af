package convert

import (
	"os"
	"path/filepath"
	"testing"
)

// A journal keeps its tensors only for the same stamp and while the
// partial (or finished) file it describes exists; entries become durable
// at Flush; Complete needs the mark and the file.
func TestJournal(t *testing.T) {
	for _, tc := range []struct {
		name     string
		stamp    string // stamp of the reopen
		partial  bool   // out.partial present at reopen
		wantKept bool
	}{
		{"same stamp, partial present", "a", true, true},
		{"other stamp", "b", true, false},
		{"partial gone", "a", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, "m.gguf")
			jp := out + ".journal"
			if err := os.WriteFile(out+".partial", []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			j, err := OpenJournal(jp, out, "a")
			if err != nil {
				t.Fatal(err)
			}
			j.Done(0, "t0")
			j.Done(3, "t3")
			if j.Has(0, "t0", nil) || j.Durable() != 0 {
				t.Fatal("a tensor counts as durable before Flush")
			}
			if err := j.Flush(); err != nil {
				t.Fatal(err)
			}
			if !j.Has(0, "t0", nil) || !j.Has(3, "t3", nil) || j.Has(3, "t0", nil) || j.Durable() != 2 {
				t.Fatal("flushed tensors not recorded by index and name")
			}
			j.Close()
			if !tc.partial {
				os.Remove(out + ".partial")
			}
			j, err = OpenJournal(jp, out, tc.stamp)
			if err != nil {
				t.Fatal(err)
			}
			defer j.Close()
			if got := j.Has(3, "t3", nil); got != tc.wantKept {
				t.Errorf("tensor kept %v, want %v", got, tc.wantKept)
			}
			if j.Complete(out) {
				t.Error("complete before MarkComplete")
			}
			if err := j.MarkComplete(out); err != nil {
				t.Fatal(err)
			}
			if j.Complete(out) {
				t.Error("complete without the file")
			}
			if err := os.WriteFile(out, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if !j.Complete(out) {
				t.Error("not complete with the mark and the file")
			}
		})
	}
}
