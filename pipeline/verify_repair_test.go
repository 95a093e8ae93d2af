package pipeline_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/manifest"
)

// damageBlob flips one byte of a blob and puts its mtime back, so its
// stamp (size, mtime, inode) still matches: only a re-hash can tell.
func damageBlob(t *testing.T, p string) {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	off := fi.Size() / 2
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x20
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	f.Close()
	os.Chmod(p, fi.Mode().Perm())
	if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
}

// `pipeline run --verify` over a blob damaged in place (stamp intact) must
// leave the blob, and the view, holding the bytes of its digest again:
// the stage re-runs and its output replaces the damaged blob even though a
// blob "with that digest" is already there.
func TestCLIRunVerifyRepairsDamage(t *testing.T) {
	models, _ := filepath.Abs("../testdata/models/qwen35-tiny")
	for _, tc := range []struct {
		name, stage, file string // the damaged output (its path ends in file)
	}{
		{"import", "m", "b.bin"},    // Ingest
		{"synth", "s", "synth.bin"}, // Journal.Commit
		{"gguf", "g", ".gguf"},      // AdoptKnown (hard link from the work dir)
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, filepath.Join(dir, "m/a.bin"), strings.Repeat("a", 4096))
			write(t, filepath.Join(dir, "m/b.bin"), strings.Repeat("b", 4096))
			p := filepath.Join(dir, "p.yaml")
			write(t, p, "name: v\nstages:\n"+
				"  - name: m\n    import: { path: m, copy: true }\n"+ // a copy: in place, the blob is the user's file
				"  - name: s\n    synth: { size: 100000, units: 4, from: m }\n"+
				"  - name: base\n    import: { path: "+models+"/base }\n"+
				"  - name: g\n    gguf: { from: base, model_name: base }\n    out: out/g\n")
			if r := ferry(t, "pipeline", "run", p); r.code != 0 {
				t.Fatal(r.stderr)
			}
			store, err := manifest.Load(filepath.Join(dir, ".ferry"))
			if err != nil {
				t.Fatal(err)
			}
			var out *manifest.Output
			for _, r := range store.Records() {
				for i, o := range r.Outputs {
					if r.Stage == tc.stage && strings.HasSuffix(o.Path, tc.file) {
						out = &r.Outputs[i]
					}
				}
			}
			if out == nil {
				t.Fatalf("no output %s of stage %s", tc.file, tc.stage)
			}
			blob := store.BlobPath(out.Digest)
			want, err := os.ReadFile(blob)
			if err != nil {
				t.Fatal(err)
			}
			damageBlob(t, blob)

			r := ferry(t, "pipeline", "run", "--verify", p)
			if r.code != 0 {
				t.Fatalf("run --verify: exit %d\n%s%s", r.code, r.stdout, r.stderr)
			}
			if !strings.Contains(r.stdout, "content does not match its digest") {
				t.Errorf("run --verify does not say what it repaired:\n%s", r.stdout)
			}
			if r := ferry(t, "store", "verify", p); r.code != 0 {
				t.Errorf("store verify after run --verify: exit %d\n%s%s", r.code, r.stdout, r.stderr)
			}
			if got, _ := os.ReadFile(blob); !bytes.Equal(got, want) {
				t.Errorf("blob %s still damaged after run --verify", out.Digest.Short())
			}
			view := filepath.Join(dir, ".ferry", "views", tc.stage, out.Path)
			if tc.stage == "g" {
				view = filepath.Join(dir, "out", "g", out.Path)
			}
			if got, err := os.ReadFile(view); err != nil || !bytes.Equal(got, want) {
				t.Errorf("view %s: damaged or unreadable after run --verify (%v)", view, err)
			}
			// Nothing is left to repair.
			r = ferry(t, "pipeline", "run", "--verify", p)
			if r.code != 0 || strings.Contains(r.stdout, " run ") {
				t.Errorf("second run --verify: exit %d\n%s%s", r.code, r.stdout, r.stderr)
			}
		})
	}
}
