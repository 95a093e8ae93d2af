package journal

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TestOpen: entries come back only for the same ref; a torn last line is
// dropped (and the next append starts a line of its own); another ref or
// an unreadable file starts over.
func TestOpen(t *testing.T) {
	for _, tc := range []struct {
		name      string
		tamper    func(p string)
		ref       string
		wantUnits []string
		wantFresh bool
	}{
		{"same ref", nil, "a", []string{"u1", "u2"}, false},
		{"torn last line", func(p string) {
			f, _ := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
			f.WriteString(`{"unit":"u3","en`)
			f.Close()
		}, "a", []string{"u1", "u2"}, false},
		{"other ref", nil, "b", nil, true},
		{"not a journal", func(p string) { os.WriteFile(p, []byte("stamp 1234\n0 t\n"), 0o644) }, "a", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "j")
			l, es, fresh, err := Open(p, "a")
			if err != nil || len(es) != 0 || !fresh {
				t.Fatalf("new journal: %v %v %v", es, fresh, err)
			}
			if err := l.Append(Entry{Unit: "u1", End: 10, State: []byte{1, 2}}, Entry{Unit: "u2", End: 20}); err != nil {
				t.Fatal(err)
			}
			l.Close()
			if tc.tamper != nil {
				tc.tamper(p)
			}
			l, es, fresh, err = Open(p, tc.ref)
			if err != nil {
				t.Fatal(err)
			}
			var units []string
			for _, e := range es {
				units = append(units, e.Unit)
			}
			if fresh != tc.wantFresh || len(units) != len(tc.wantUnits) {
				t.Fatalf("units %v fresh %v, want %v fresh %v", units, fresh, tc.wantUnits, tc.wantFresh)
			}
			for i := range units {
				if units[i] != tc.wantUnits[i] {
					t.Fatalf("units %v, want %v", units, tc.wantUnits)
				}
			}
			if len(es) > 0 && (es[0].End != 10 || string(es[0].State) != "\x01\x02") {
				t.Errorf("entry %+v lost its end or state", es[0])
			}
			// Appends after a reopen (a torn tail dropped) read back,
			// fsynced (Append, above) or not.
			if err := l.AppendNoSync(Entry{Unit: "u9"}); err != nil {
				t.Fatal(err)
			}
			l.Close()
			if ref, err := Ref(p); err != nil || ref != tc.ref {
				t.Errorf("Ref: %q %v, want %q", ref, err, tc.ref)
			}
			l, es, _, err = Open(p, tc.ref)
			if err != nil || len(es) != len(tc.wantUnits)+1 || es[len(es)-1].Unit != "u9" {
				t.Fatalf("after append: %+v %v", es, err)
			}
			if err := l.Remove(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("Remove left the journal: %v", err)
			}
		})
	}
}
