package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/manifest"

	"github.com/ferry-llm/ferry/pipeline/pipelinetest"

	. "github.com/ferry-llm/ferry/pipeline" // an external test package: pipelinetest imports pipeline
)

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// loadSpec writes src as dir/p.yaml and loads it with the built-in kinds
// and synth.
func loadSpec(t *testing.T, dir, src string) *Spec {
	return loadSpecKinds(t, dir, src, pipelinetest.Kinds())
}

func loadSpecKinds(t *testing.T, dir, src string, kinds *Kinds) *Spec {
	t.Helper()
	p := filepath.Join(dir, "p.yaml")
	writeFile(t, p, src)
	s, err := Load(p, WithKinds(kinds))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func actions(rep *Report) map[string]string {
	m := map[string]string{}
	for _, s := range rep.Stages {
		m[s.Stage] = string(s.Action) + ": " + s.Reason
	}
	return m
}

func wantActions(t *testing.T, what string, rep *Report, want map[string]string) {
	t.Helper()
	got := actions(rep)
	for st, w := range want {
		if !strings.HasPrefix(got[st], w) {
			t.Errorf("%s: stage %s: %q, want prefix %q", what, st, got[st], w)
		}
	}
}

// unitLog counts "synth unit begin" log records per stage.
type unitLog struct {
	mu    sync.Mutex
	begin map[string]int
}

type unitLogHandler struct {
	u     *unitLog
	stage string
}

func (h unitLogHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h unitLogHandler) WithGroup(string) slog.Handler            { return h }
func (h unitLogHandler) WithAttrs(as []slog.Attr) slog.Handler {
	for _, a := range as {
		if a.Key == "stage" {
			h.stage = a.Value.String()
		}
	}
	return h
}
func (h unitLogHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "synth unit begin" {
		h.u.mu.Lock()
		h.u.begin[h.stage]++
		h.u.mu.Unlock()
	}
	return nil
}

const importSpec = `name: t
stages:
  - name: src
    import: { path: src }
  - name: syn
    synth: { size: 64KiB, units: 8, seed: %SEED%, from: src }
    out: out/syn
`

func TestRunSkipAndChanges(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "src/config.json"), `{"a":1}`)
	writeFile(t, filepath.Join(dir, "src/sub/w.bin"), strings.Repeat("w", 5000))
	writeFile(t, filepath.Join(dir, "src/.git/HEAD"), "ignored")
	spec := loadSpec(t, dir, strings.ReplaceAll(importSpec, "%SEED%", "1"))
	ctx := context.Background()

	rep, err := Plan(spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantActions(t, "first plan", rep, map[string]string{"src": "run: new", "syn": "run: new (after src)"})
	if rep.Stages[0].Cause != CauseNew || rep.Stages[1].Cause != CauseNew {
		t.Errorf("first plan causes %q %q", rep.Stages[0].Cause, rep.Stages[1].Cause)
	}
	rep, err = Run(ctx, spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantActions(t, "first run", rep, map[string]string{"src": "run: new", "syn": "run: new"})
	// Outputs: every file's digest, a view of symlinks that read back.
	st := spec.Lookup("src")
	var paths []string
	for _, o := range rep.Stages[0].Outputs {
		paths = append(paths, o.Path)
		b, err := os.ReadFile(filepath.Join(spec.ViewDir(st), o.Path))
		if err != nil || manifest.DigestOf(b) != o.Digest {
			t.Errorf("view %s: %v", o.Path, err)
		}
	}
	if strings.Join(paths, ",") != "config.json,sub/w.bin" {
		t.Errorf("imported %v", paths)
	}
	if _, err := os.Readlink(filepath.Join(dir, "out/syn/synth.bin")); err != nil {
		t.Errorf("out: view missing: %v", err)
	}

	// Second run: nothing runs and manifest.json is not rewritten.
	mpath := filepath.Join(spec.Store, "manifest.json")
	before, _ := os.Stat(mpath)
	rep, err = Run(ctx, spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantActions(t, "second run", rep, map[string]string{"src": "skip: up to date", "syn": "skip: up to date"})
	after, _ := os.Stat(mpath)
	if !after.ModTime().Equal(before.ModTime()) || !os.SameFile(before, after) {
		t.Error("a no-op run rewrote manifest.json")
	}

	// Touch a file: import re-runs (stamp changed) but its digests do not
	// change, so the stage after it is skipped.
	future := time.Now().Add(time.Hour)
	os.Chtimes(filepath.Join(dir, "src/config.json"), future, future)
	rep, _ = Plan(spec, Options{})
	wantActions(t, "plan after touch", rep, map[string]string{"src": "run: source file changed: config.json", "syn": "pending: after src"})
	if c := rep.Stages[0].Cause; c != CauseSource {
		t.Errorf("cause after touch %q", c)
	}
	rep, err = Run(ctx, spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantActions(t, "run after touch", rep, map[string]string{"src": "run: source file changed", "syn": "skip: up to date"})

	// Change content: the next stage sees its input change.
	writeFile(t, filepath.Join(dir, "src/config.json"), `{"a":2}`)
	rep, _ = Plan(spec, Options{})
	wantActions(t, "plan after edit", rep, map[string]string{"src": "run: source file changed: config.json"})
	rep, err = Run(ctx, spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantActions(t, "run after edit", rep, map[string]string{"src": "run", "syn": "run: input changed: src"})
	if c := rep.Stages[1].Cause; c != CauseInput {
		t.Errorf("cause after edit %q", c)
	}

	// Added and removed files.
	writeFile(t, filepath.Join(dir, "src/new.txt"), "n")
	rep, _ = Plan(spec, Options{})
	wantActions(t, "plan after add", rep, map[string]string{"src": "run: source file added: new.txt"})
	os.Remove(filepath.Join(dir, "src/new.txt"))
	os.Remove(filepath.Join(dir, "src/sub/w.bin"))
	rep, _ = Plan(spec, Options{})
	wantActions(t, "plan after remove", rep, map[string]string{"src": "run: source file removed"})
	writeFile(t, filepath.Join(dir, "src/sub/w.bin"), strings.Repeat("w", 5000))
	if _, err := Run(ctx, spec, Options{}); err != nil {
		t.Fatal(err)
	}

	// Parameters changed.
	spec2 := loadSpec(t, dir, strings.ReplaceAll(importSpec, "%SEED%", "2"))
	rep, _ = Plan(spec2, Options{})
	wantActions(t, "plan after param change", rep, map[string]string{"src": "skip", "syn": "run: parameters changed: seed 1 -> 2"})
	if c := rep.Stages[1].Cause; c != CauseParams || rep.Stages[0].Cause != "" {
		t.Errorf("causes %q %q", rep.Stages[0].Cause, c)
	}

	// --force, --only, --from.
	rep, _ = Plan(spec, Options{Force: []string{"src"}})
	wantActions(t, "force", rep, map[string]string{"src": "run: forced", "syn": "pending: after src"})
	rep, err = Run(ctx, spec, Options{Only: "syn", Force: []string{"syn"}})
	if err != nil {
		t.Fatal(err)
	}
	wantActions(t, "only", rep, map[string]string{"src": "not-selected", "syn": "run: forced"})
	rep, err = Run(ctx, spec, Options{From: "src"})
	if err != nil {
		t.Fatal(err)
	}
	wantActions(t, "from", rep, map[string]string{"src": "run: forced", "syn": "run: forced"})
	if _, err := Run(ctx, spec, Options{Only: "nope"}); errkind.Of(err) != errkind.Usage {
		t.Errorf("--only nope: %v", err)
	}
}

func TestRunOnlyNeedsInputs(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "src/a"), "a")
	spec := loadSpec(t, dir, strings.ReplaceAll(importSpec, "%SEED%", "1"))
	_, err := Run(context.Background(), spec, Options{Only: "syn"})
	if err == nil || !strings.Contains(err.Error(), "src has not run yet") {
		t.Fatalf("err %v", err)
	}
}

// chainSpec is importSpec with a stage after the synth: --only top reads
// mid, which reads src, both outside the selection.
const chainSpec = `name: t
stages:
  - name: src
    import: { path: src }
  - name: mid
    synth: { size: 64KiB, units: 8, seed: %SEED%, from: src }
  - name: top
    synth: { size: 32KiB, units: 4, seed: 7, from: mid }
`

// TestRunOnlyOutOfDateInput: a stage outside the selection is read as a
// run of the whole file would have it now. Its files changed in place
// since the import read them (an adapter retrained), the import re-run
// but not the stage after it, or that stage's parameters edited: the run
// refuses, plan says the same, and nothing runs. Files read again with the
// same bytes, or put back as they were, give back the record made from
// them, not the latest one.
func TestRunOnlyOutOfDateInput(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	src := filepath.Join(dir, "src", "w.bin")
	writeFile(t, src, strings.Repeat("a", 5000))
	spec := loadSpec(t, dir, strings.ReplaceAll(chainSpec, "%SEED%", "1"))
	full := func(what string) *Report {
		t.Helper()
		rep, err := Run(ctx, spec, Options{})
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return rep
	}
	topInput := func(rep *Report) string {
		t.Helper()
		st, err := manifest.Load(spec.Store)
		if err != nil {
			t.Fatal(err)
		}
		rec := st.Record(rep.Stages[2].Key)
		if rec == nil || len(rec.Inputs) != 1 {
			t.Fatalf("top's record: %+v", rec)
		}
		return string(rec.Inputs[0].Digest)
	}
	refused := func(what string, spec *Spec, want string) {
		t.Helper()
		rep, err := Plan(spec, Options{Only: "top"})
		if err != nil {
			t.Fatalf("%s: plan: %v", what, err)
		}
		wantActions(t, what+": plan", rep, map[string]string{"mid": "not-selected: stage mid is out of date (" + want})
		if _, err := Run(ctx, spec, Options{Only: "top"}); err == nil || !strings.Contains(err.Error(), "stage mid is out of date ("+want) {
			t.Fatalf("%s: run --only top: %v, want mid out of date (%s…)", what, err, want)
		}
	}
	fromA := topInput(full("first run"))

	// The adapter retrained in place.
	writeFile(t, src, strings.Repeat("b", 5000))
	refused("file changed", spec, "src's files changed since it read them")
	// Nothing ran: the import's record is still the first one's.
	if rep, _ := Plan(spec, Options{}); actions(rep)["src"] == "skip" {
		t.Fatal("a refused run imported the new files")
	}

	// Imported again, the stage after it not made again.
	if _, err := Run(ctx, spec, Options{Only: "src"}); err != nil {
		t.Fatal(err)
	}
	refused("import re-run", spec, "mid: input changed: src")
	fromB := topInput(full("run on the new files"))
	if fromB == fromA {
		t.Fatal("top made from the same mid on other files")
	}

	// The stage's parameters edited in the file.
	refused("parameters changed", loadSpec(t, dir, strings.ReplaceAll(chainSpec, "%SEED%", "2")), "mid: parameters changed")

	// The same bytes again (touched): refused until the import reads them
	// again, which finds them the same: then mid is up to date.
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(src, later, later); err != nil {
		t.Fatal(err)
	}
	refused("touched", spec, "src's files changed since it read them")
	if _, err := Run(ctx, spec, Options{Only: "src"}); err != nil {
		t.Fatal(err)
	}
	rep, err := Run(ctx, spec, Options{Only: "top"})
	if err != nil {
		t.Fatalf("--only top after the touched files were read again: %v", err)
	}
	wantActions(t, "after touch", rep, map[string]string{"top": "skip"})

	// Put back as they were and imported: mid made from them is the one
	// read, though the latest mid is the other.
	writeFile(t, src, strings.Repeat("a", 5000))
	if _, err := Run(ctx, spec, Options{Only: "src"}); err != nil {
		t.Fatal(err)
	}
	rep, err = Run(ctx, spec, Options{Only: "top"})
	if err != nil {
		t.Fatalf("--only top on the first files again: %v", err)
	}
	wantActions(t, "files put back", rep, map[string]string{"top": "skip"})
	if got := topInput(rep); got != fromA {
		t.Errorf("top read mid %s, want the one made from these files, %s", got, fromA)
	}
}

// A stage before the input an --only run reads is not looked at for
// damage, nor hashed under --verify: a damaged blob there is not this
// run's to find (nor to repair).
func TestRunOnlyVerifySkipsEarlierDamage(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "src", "w.bin"), strings.Repeat("a", 5000))
	spec := loadSpec(t, dir, `name: t
stages:
  - name: src
    import: { path: src }
  - name: a
    synth: { size: 64KiB, units: 8, seed: 1, from: src }
  - name: mid
    synth: { size: 64KiB, units: 8, seed: 2, from: a }
  - name: top
    synth: { size: 32KiB, units: 4, seed: 7, from: mid }
`)
	rep, err := Run(ctx, spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := manifest.Load(spec.Store)
	if err != nil {
		t.Fatal(err)
	}
	damageBlob(t, st.BlobPath(rep.Stages[1].Outputs[0].Digest)) // a's
	rep, err = Run(ctx, spec, Options{Only: "top", Verify: true})
	if err != nil {
		t.Fatalf("--only top --verify, a (not read) damaged: %v", err)
	}
	wantActions(t, "only top", rep, map[string]string{"top": "skip"})
}

func TestNotBuiltKind(t *testing.T) {
	// A kind registered as not built, as every kind is until its package lands.
	kinds := BuiltinKinds().With("future", Kind{NotBuilt: "issue 99 (future/)", RefKeys: []string{"from"}})
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "src/a"), "a")
	spec := loadSpecKinds(t, dir, `name: t
stages:
  - name: src
    import: { path: src }
  - name: ship
    future: { from: [src], to: [h:~/x] }
`, kinds)
	rep, err := Plan(spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantActions(t, "plan", rep, map[string]string{"src": "run: new", "ship": `not-built: kind "future" is not built yet (comes with issue 99 (future/))`})
	if _, err := Run(context.Background(), spec, Options{}); !errors.Is(err, errkind.ErrNotBuilt) {
		t.Fatalf("run: %v", err)
	}
	if _, err := os.Stat(spec.Store); !errors.Is(err, os.ErrNotExist) {
		t.Error("a refused run created the store")
	}
}

// A cancelled run leaves a resumable state: the resumed run ends with the
// digest of an uninterrupted one and does not redo finished units.
func TestCancelResume(t *testing.T) {
	const src = `name: t
stages:
  - name: big
    synth: { size: 8MiB, units: 32, seed: 3 }
`
	ref := t.TempDir()
	refSpec := loadSpec(t, ref, src)
	rep, err := Run(context.Background(), refSpec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := rep.Stages[0].Outputs[0].Digest

	dir := t.TempDir()
	spec := loadSpec(t, dir, src)
	ul := &unitLog{begin: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	prog := &cancelAfter{n: 3 << 20, cancel: cancel}
	_, err = Run(ctx, spec, Options{Log: slog.New(unitLogHandler{u: ul}), Progress: func(string) Progress { return prog }})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled run: %v", err)
	}
	first := ul.begin["big"]
	if first == 0 || first >= 32 {
		t.Fatalf("cancelled run began %d units", first)
	}
	st, _ := manifest.Load(spec.Store)
	if st.StageRecord("t", "big") != nil {
		t.Fatal("a cancelled stage left a record")
	}
	rep, err = Run(context.Background(), spec, Options{Log: slog.New(unitLogHandler{u: ul})})
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Stages[0].Outputs[0].Digest; got != want {
		t.Fatalf("resumed digest %s, want %s", got, want)
	}
	// At most the one unit that was cut off is written twice.
	if total := ul.begin["big"]; total > 33 {
		t.Errorf("%d unit writes for 32 units: finished units were redone", total)
	}
}

type cancelAfter struct {
	mu     sync.Mutex
	n      int64
	done   int64
	cancel func()
}

func (c *cancelAfter) SetTotal(int64) {}
func (c *cancelAfter) Add(n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done += n
	if c.done >= c.n {
		c.cancel()
	}
}

// A damaged blob the store holds (copy: true; a blob read in place is
// damaged by its file changing, TestImportInPlace) makes plan re-run its
// stage, and the run repairs it.
func TestDamageMakesPlanRerun(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "src/a.bin"), strings.Repeat("a", 1000))
	writeFile(t, filepath.Join(dir, "src/b.bin"), strings.Repeat("b", 1000))
	spec := loadSpec(t, dir, strings.ReplaceAll(strings.ReplaceAll(importSpec, "%SEED%", "1"), "path: src }", "path: src, copy: true }"))
	rep, err := Run(context.Background(), spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	outs := rep.Stages[0].Outputs
	s, _ := manifest.Load(spec.Store)
	blob := s.BlobPath(outs[0].Digest)
	damage := func() {
		fi, _ := os.Stat(blob)
		os.Chmod(blob, 0o644)
		b, _ := os.ReadFile(blob)
		b[10] ^= 0x40
		os.WriteFile(blob, b, 0o444)
		os.Chtimes(blob, fi.ModTime(), fi.ModTime()) // the stamp alone cannot tell
	}
	damage()

	// Without verify the stamp matches and plan reads no data: it cannot
	// see the flip. --verify re-hashes and sees it.
	rep, _ = Plan(spec, Options{})
	wantActions(t, "plan (stamps only)", rep, map[string]string{"src": "skip", "syn": "skip"})
	rep, _ = Plan(spec, Options{Verify: true})
	wantActions(t, "plan --verify", rep, map[string]string{"src": "run: output a.bin content does not match"})
	// store verify records the damage; plain plan then says so.
	lock, _ := s.TryLock("test")
	vr, err := s.Verify(context.Background(), nil)
	lock.Unlock()
	if err != nil || vr.OK() {
		t.Fatalf("verify: %+v %v", vr, err)
	}
	rep, _ = Plan(spec, Options{})
	wantActions(t, "plan after verify", rep, map[string]string{"src": "run: output a.bin damaged", "syn": "pending: after src"})
	// Run repairs it.
	rep, err = Run(context.Background(), spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantActions(t, "repair run", rep, map[string]string{"src": "run: output a.bin damaged", "syn": "skip"})
	if got, _, _ := manifest.HashFile(blob); got != outs[0].Digest {
		t.Error("blob not repaired")
	}
	rep, _ = Plan(spec, Options{Verify: true})
	wantActions(t, "plan after repair", rep, map[string]string{"src": "skip", "syn": "skip"})

	// A run that finds a blob damaged and does not make it again (here the
	// stage's re-run fails; synth's fail is not part of its key) ends as a
	// verification failure (exit 3) naming the blob's output, besides the
	// stage's own error.
	syn := s.BlobPath(rep.Stages[1].Outputs[0].Digest)
	blob = syn
	damage()
	spec = loadSpec(t, dir, strings.ReplaceAll(strings.ReplaceAll(strings.ReplaceAll(importSpec, "%SEED%", "1"), "path: src }", "path: src, copy: true }"), "from: src }", `from: src, fail: "disk on fire" }`))
	_, err = Run(context.Background(), spec, Options{Verify: true})
	if errkind.Of(err) != errkind.VerifyFailed || !strings.Contains(fmt.Sprint(err), "disk on fire") ||
		!strings.Contains(fmt.Sprint(err), "(stage syn output synth.bin): content does not match its digest") {
		t.Fatalf("run --verify whose repair failed: %v (%v)", err, errkind.Of(err))
	}
}

func TestImportSingleFile(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "w.gguf"), "GGUF....")
	spec := loadSpec(t, dir, "name: f\nstages:\n  - name: g\n    import: { path: w.gguf }\n")
	rep, err := Run(context.Background(), spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	outs := rep.Stages[0].Outputs
	if len(outs) != 1 || outs[0].Path != "w.gguf" || outs[0].Digest != manifest.DigestOf([]byte("GGUF....")) {
		t.Fatalf("outputs %+v", outs)
	}
	writeFile(t, filepath.Join(dir, "w.gguf"), "GGUF!!!!")
	rep, _ = Plan(spec, Options{})
	wantActions(t, "plan after change", rep, map[string]string{"g": "run: source file changed: w.gguf"})
	os.Remove(filepath.Join(dir, "w.gguf"))
	rep, _ = Plan(spec, Options{})
	wantActions(t, "plan after removal", rep, map[string]string{"g": "invalid: source missing"})
	if _, err := Run(context.Background(), spec, Options{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("run with the source gone: %v", err)
	}
}

// Ferry's release version is in no stage key: another release shares the
// records (and records it made them in each). A kind's format version is:
// bumping it re-runs that kind's stages, and plan says why.
func TestRunVersionNotInKey(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "src/a.bin"), "a")
	src := strings.ReplaceAll(importSpec, "%SEED%", "1")
	spec := loadSpec(t, dir, src)
	if _, err := Run(context.Background(), spec, Options{Version: "0.1.0"}); err != nil {
		t.Fatal(err)
	}
	rep, _ := Plan(spec, Options{Version: "0.2.0"})
	wantActions(t, "next release", rep, map[string]string{"src": "skip", "syn": "skip"})
	store, err := manifest.Load(spec.Store)
	if err != nil {
		t.Fatal(err)
	}
	if rec := store.StageRecord("t", "syn"); rec == nil || rec.FerryVersion != "0.1.0" {
		t.Fatalf("record: %+v, want ferry_version 0.1.0", rec)
	}

	synth2 := pipelinetest.Synth()
	synth2.Version = "2"
	spec2 := loadSpecKinds(t, dir, src, pipelinetest.Kinds().With("synth", synth2))
	rep, _ = Plan(spec2, Options{Version: "0.1.0"})
	wantActions(t, "synth version 2", rep, map[string]string{"src": "skip", "syn": "run: kind synth format version changed (1 -> 2)"})
	if c := rep.Stages[1].Cause; c != CauseVersion {
		t.Errorf("cause %q, want %q", c, CauseVersion)
	}
}

// A stage that is running when the run is cancelled (Ctrl-C, SIGTERM) is
// interrupted, not failed: in the report, the events and status, with
// what it left to resume. A stage that failed before stays failed, one
// that had not started says so, and the run's error is of kind
// Interrupted and never says "context canceled".
func TestInterruptedStage(t *testing.T) {
	dir := t.TempDir()
	spec := loadSpec(t, dir, `name: t
stages:
  - name: big
    synth: { size: 32MiB, units: 8, seed: 3 }
  - name: bad
    synth: { size: 1KiB, fail: disk on fire }
  - name: after
    synth: { size: 1KiB, from: big }
`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Cancel once bad has failed and big has written a unit.
	var mu sync.Mutex
	var evs []Event
	var failed bool
	var written int64
	maybeCancel := func() {
		if failed && written >= 4<<20 {
			cancel()
		}
	}
	prog := progressFunc(func(n int64) {
		mu.Lock()
		defer mu.Unlock()
		written += n
		maybeCancel()
	})
	rep, err := Run(ctx, spec, Options{Stages: 3, Progress: func(string) Progress { return prog },
		Events: func(e Event) {
			mu.Lock()
			defer mu.Unlock()
			evs = append(evs, e)
			if e.Event == EventFailed && e.Stage == "bad" {
				failed = true
				maybeCancel()
			}
		}})
	var ie *InterruptedError
	if errkind.Of(err) != errkind.Interrupted || !errors.Is(err, context.Canceled) || !errors.As(err, &ie) {
		t.Fatalf("run: %v (kind %v), want an *InterruptedError of kind interrupted", err, errkind.Of(err))
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "interrupted; stage big was running (") || !strings.Contains(msg, "resumable") ||
		!strings.Contains(msg, "stage bad: disk on fire") || strings.Contains(msg, "context canceled") {
		t.Errorf("run error %q: want it to say big was running, what it left and bad's failure, never 'context canceled'", msg)
	}
	got := map[string]StageReport{}
	for _, s := range rep.Stages {
		got[s.Stage] = s
	}
	if s := got["big"]; s.Action != ActionInterrupted || s.Error != "" || s.Resumable <= 0 || s.Seconds <= 0 {
		t.Errorf("big: %+v, want interrupted, no error, with resumable bytes and seconds", s)
	}
	if s := got["bad"]; s.Action != ActionFailed || s.Error != "disk on fire" {
		t.Errorf("bad: %+v, want failed: disk on fire", s)
	}
	if s := got["after"]; s.Action != ActionBlocked || s.Reason != "cancelled before it started" {
		t.Errorf("after: %+v, want blocked: cancelled before it started", s)
	}
	var seq []string
	var end *Event
	for i, e := range evs {
		switch e.Event {
		case EventInterrupted, EventFailed:
			seq = append(seq, string(e.Event)+" "+e.Stage)
			if e.Event == EventInterrupted && (e.Seconds <= 0 || !strings.HasSuffix(e.Reason, " resumable")) {
				t.Errorf("interrupted event %+v: want its seconds and what it left", e)
			}
		case EventEnd:
			end = &evs[i]
		}
	}
	if g := strings.Join(seq, ","); g != "failed bad,interrupted big" {
		t.Errorf("events %s, want failed bad,interrupted big", g)
	}
	if end == nil || end.Error != msg || end.Report == nil {
		t.Errorf("end event %+v, want the run's error %q and its report", end, msg)
	}

	st, err := Status(spec)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]StageStatus{}
	for _, s := range st.Stages {
		states[s.Stage] = s
	}
	if s := states["big"]; s.State != StateInterrupted || s.Resumable <= 0 || !strings.HasSuffix(s.Detail, " resumable") {
		t.Errorf("status big: %+v, want interrupted with what it left", s)
	}
	if s := states["bad"]; s.State != StateFailed {
		t.Errorf("status bad: %+v, want failed", s)
	}
	if s := states["after"]; s.State != StateNeverRun {
		t.Errorf("status after: %+v, want never-run", s)
	}

	// The next run resumes big and runs after; status is complete.
	spec = loadSpec(t, dir, `name: t
stages:
  - name: big
    synth: { size: 32MiB, units: 8, seed: 3 }
  - name: after
    synth: { size: 1KiB, from: big }
`)
	if _, err := Run(context.Background(), spec, Options{}); err != nil {
		t.Fatal(err)
	}
	if st, err = Status(spec); err != nil {
		t.Fatal(err)
	}
	for _, s := range st.Stages {
		if s.State != StateComplete {
			t.Errorf("status after the resumed run: %s %s", s.Stage, s.State)
		}
	}
}

// progressFunc is a Progress that hands each count to a function.
type progressFunc func(int64)

func (f progressFunc) SetTotal(int64) {}
func (f progressFunc) Add(n int64)    { f(n) }
