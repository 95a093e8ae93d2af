package pipeline_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/manifest"

	. "github.com/ferry-llm/ferry/pipeline" // an external test package: pipelinetest imports pipeline
)

// An import applies ferry's symlink policy: a file linking outside the
// imported directory is refused (naming the link and its target, nothing
// recorded) unless follow_links is set; links inside it and a Hugging Face
// cache snapshot (links into ../../blobs/) are imported. (Stages reading an
// import's view, links into the store, are the conformance suite's.)
func TestImportSymlinkPolicy(t *testing.T) {
	type layout func(t *testing.T, dir, secret string) string // returns the import path
	plain := func(name string) layout {
		return func(t *testing.T, dir, secret string) string {
			m := filepath.Join(dir, "model")
			writeFile(t, filepath.Join(m, "config.json"), `{"a":1}`)
			writeFile(t, filepath.Join(m, "sub/w.bin"), "weights")
			if name != "" {
				if err := os.Symlink(secret, filepath.Join(m, name)); err != nil {
					t.Fatal(err)
				}
			}
			return m
		}
	}
	inside := func(t *testing.T, dir, secret string) string {
		m := plain("")(t, dir, secret)
		if err := os.Symlink(filepath.Join("sub", "w.bin"), filepath.Join(m, "notes.txt")); err != nil {
			t.Fatal(err)
		}
		return m
	}
	hfCache := func(t *testing.T, dir, secret string) string {
		repo := filepath.Join(dir, "hub", "models--org--m")
		snap := filepath.Join(repo, "snapshots", strings.Repeat("ab", 20))
		for name, content := range map[string]string{"config.json": `{"a":1}`, "notes.txt": "notes"} {
			h := sha256.Sum256([]byte(content))
			blob := hex.EncodeToString(h[:])
			writeFile(t, filepath.Join(repo, "blobs", blob), content)
			os.MkdirAll(snap, 0o755)
			if err := os.Symlink(filepath.Join("..", "..", "blobs", blob), filepath.Join(snap, name)); err != nil {
				t.Fatal(err)
			}
		}
		return snap
	}
	tests := []struct {
		name    string
		layout  layout
		follow  bool
		refused string // the link named in the error, "" if imported
		files   int
	}{
		{"notes.txt outside", plain("notes.txt"), false, "notes.txt", 0},
		{"generation_config.json outside", plain("generation_config.json"), false, "generation_config.json", 0},
		{"adapter weights outside", plain("adapter_model.safetensors"), false, "adapter_model.safetensors", 0},
		{"outside, follow_links", plain("notes.txt"), true, "", 3},
		{"link inside", inside, false, "", 3},
		{"Hugging Face cache snapshot", hfCache, false, "", 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			secret := filepath.Join(t.TempDir(), "secret")
			writeFile(t, secret, "root:x:0:0\n")
			src := tc.layout(t, dir, secret)
			follow := ""
			if tc.follow {
				follow = "      follow_links: true\n"
			}
			spec := loadSpec(t, dir, "name: l\nstages:\n  - name: m\n    import:\n      path: '"+src+"'\n"+follow+
				"  - name: s\n    synth: { size: 4KiB, seed: 1, from: m }\n")
			rep, err := Run(context.Background(), spec, Options{})
			if tc.refused != "" {
				var le *fsutil.LinkError
				if !errors.As(err, &le) || le.Path != filepath.Join(src, tc.refused) || !strings.Contains(err.Error(), secret) {
					t.Fatalf("run: %v, want a link error naming %s and %s", err, tc.refused, secret)
				}
				if k := errkind.Of(err); k != errkind.BadInput {
					t.Errorf("error kind %v, want bad input (exit 2)", k)
				}
				s, _ := manifest.Load(spec.Store)
				if r := s.StageRecord("l", "m"); r != nil {
					t.Errorf("a refused import left a record: %+v", r.Outputs)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if outs := rep.Stages[0].Outputs; len(outs) != tc.files {
				t.Errorf("imported %d files, want %d: %+v", len(outs), tc.files, outs)
			}
		})
	}
}
