package pipeline_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/manifest"

	. "github.com/ferry-llm/ferry/pipeline" // an external test package: pipelinetest imports pipeline
)

// canClone reports whether files in dir can be cloned (reflinks): then an
// import clones instead of reading in place.
func canClone(t *testing.T, dir string) bool {
	t.Helper()
	a := filepath.Join(dir, ".clone-probe")
	os.WriteFile(a, []byte("x"), 0o644)
	defer os.Remove(a)
	defer os.Remove(a + "2")
	err := fsutil.Clone(a, a+"2")
	if err != nil && !errors.Is(err, fsutil.ErrCloneUnsupported) {
		t.Fatal(err)
	}
	return err == nil
}

func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
}

// An import copies nothing: its blobs are links to the source files (or
// clones, where the file system has reflinks) and a GGUF converted from
// them is the one a copying import gives. A touched source is hashed again
// and changes nothing downstream; an edited one re-runs what depends on
// it and its stale link goes; a file edited behind ferry's back (stamp put
// back) is found by store verify, which never writes it; gc removes links,
// never the files.
func TestImportInPlace(t *testing.T) {
	models, _ := filepath.Abs("../testdata/models/qwen35-tiny/base")
	dir := t.TempDir()
	src := filepath.Join(dir, "base")
	copyTree(t, models, src)
	clones := canClone(t, dir)
	t.Logf("reflinks: %v", clones)
	const spec = `name: ip
stages:
  - name: base
    import: { path: base%s }
  - name: f16
    gguf: { from: base, outtype: f16, model_name: tiny }
`
	// The same pipeline copying its import, in another store.
	refDir := t.TempDir()
	copyTree(t, models, filepath.Join(refDir, "base"))
	ref, err := Run(context.Background(), loadSpec(t, refDir, strings.Replace(spec, "%s", ", copy: true", 1)), Options{})
	if err != nil {
		t.Fatal(err)
	}

	sp := loadSpec(t, dir, strings.Replace(spec, "%s", "", 1))
	rep, err := Run(context.Background(), sp, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := manifest.OutputsDigest(rep.Stages[1].Outputs), manifest.OutputsDigest(ref.Stages[1].Outputs); got != want {
		t.Fatalf("the GGUF of an in-place import differs from a copying import's")
	}
	if got, want := manifest.OutputsDigest(rep.Stages[0].Outputs), manifest.OutputsDigest(ref.Stages[0].Outputs); got != want {
		t.Fatalf("import outputs differ between in place and copy")
	}
	store, err := manifest.Load(sp.Store)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, o := range rep.Stages[0].Outputs {
		total += o.Size
		target, inPlace := store.InPlace(o.Digest)
		switch {
		case clones && inPlace:
			t.Errorf("%s: a link, on a file system that clones", o.Path)
		case !clones && target != filepath.Join(src, o.Path):
			t.Errorf("%s: blob links to %q, want the source file", o.Path, target)
		}
	}
	du, err := store.DiskUsage()
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range du.Stages {
		if u.Stage == "base" && !clones && (u.InPlaceBytes != total || u.BlobBytes != 0) {
			t.Errorf("du of the import: %+v, want %d bytes in place and none in blobs", u, total)
		}
	}

	// Touched: hashed again, same digests, nothing downstream runs.
	later := time.Now().Add(time.Hour)
	os.Chtimes(filepath.Join(src, "config.json"), later, later)
	pr, _ := Plan(sp, Options{})
	wantActions(t, "plan after touch", pr, map[string]string{"base": "run: source file changed: config.json", "f16": "pending"})
	rep, err = Run(context.Background(), sp, Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantActions(t, "run after touch", rep, map[string]string{"base": "run", "f16": "skip"})

	// Edited: the GGUF is made again; the old blob is not left linking to
	// the new bytes.
	gen := filepath.Join(src, "generation_config.json")
	var old manifest.Output
	for _, o := range rep.Stages[0].Outputs {
		if o.Path == "generation_config.json" {
			old = o
		}
	}
	b, _ := os.ReadFile(gen)
	os.WriteFile(gen, append(b, '\n'), 0o644)
	pr, _ = Plan(sp, Options{})
	wantActions(t, "plan after edit", pr, map[string]string{"base": "run: source file changed: generation_config.json", "f16": "pending"})
	rep, err = Run(context.Background(), sp, Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantActions(t, "run after edit", rep, map[string]string{"base": "run", "f16": "run: input changed: base"})
	store, _ = manifest.Load(sp.Store)
	if !clones {
		if _, err := os.Lstat(store.BlobPath(old.Digest)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the blob of the old generation_config.json is still there: %v", err)
		}
	}
	vr, err := store.Verify(context.Background(), nil)
	if err != nil || !vr.OK() {
		t.Fatalf("verify: %+v %v", vr, err)
	}

	// Edited with its stamp put back: only a re-hash sees it; verify
	// reports the file and leaves it alone.
	if !clones {
		tok := filepath.Join(src, "tokenizer_config.json")
		fi, _ := os.Stat(tok)
		b, _ := os.ReadFile(tok)
		b[len(b)/2] ^= 0x01
		os.WriteFile(tok, b, 0o644)
		os.Chtimes(tok, fi.ModTime(), fi.ModTime())
		vr, err = store.Verify(context.Background(), nil)
		if err != nil || vr.OK() || !strings.Contains(vr.Problems[0].What, tok) {
			t.Fatalf("verify after a hidden edit: %+v %v", vr, err)
		}
		if after, _ := os.ReadFile(tok); string(after) != string(b) {
			t.Error("verify wrote the source file")
		}
		pr, _ = Plan(sp, Options{})
		wantActions(t, "plan after verify", pr, map[string]string{"base": "run: output tokenizer_config.json damaged"})
	}

	// Nothing refers to the import any more: gc drops every link, the
	// files stay.
	before := map[string]manifest.Digest{}
	for _, o := range rep.Stages[0].Outputs {
		d, _, err := manifest.HashFile(filepath.Join(src, o.Path))
		if err != nil {
			t.Fatal(err)
		}
		before[o.Path] = d
	}
	// The stages' names now hold other work: the import's records are old.
	sp2 := loadSpec(t, dir, "name: ip\nstages:\n  - name: base\n    synth: { size: 10 }\n  - name: f16\n    synth: { size: 10 }\n")
	if _, err := Run(context.Background(), sp2, Options{}); err != nil {
		t.Fatal(err)
	}
	store, _ = manifest.Load(sp.Store)
	if _, err := store.GCPrune(true); err != nil {
		t.Fatal(err)
	}
	for p, d := range before {
		if got, _, err := manifest.HashFile(filepath.Join(src, p)); err != nil || got != d {
			t.Errorf("gc touched the source %s: %v", p, err)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(sp.Store, "blobs", "sha256")); len(ents) != 1 {
		t.Errorf("%d blobs after gc, want the synth stage's one", len(ents))
	}
}
