package pipeline_test

// Tests that run the ferry binary as a child process: exit codes, the store
// lock between two processes, store verify, and the SIGKILL test. TestMain
// builds ./cmd/ferry once into a temp dir.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/pipeline"
)

var (
	binDir   string
	binOnce  sync.Once
	binPath  string
	binError error
)

// TestMain removes the ferry binary the tests built (lazily, on first use,
// so fuzzing and benchmarks that do not need it do not pay for the build).
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// ferryBinary builds ./cmd/ferry once into a temp dir.
func ferryBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binError = os.MkdirTemp("", "ferry-bin-")
		if binError != nil {
			return
		}
		binPath = filepath.Join(binDir, "ferry")
		goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(goTool); err != nil {
			if goTool, binError = exec.LookPath("go"); binError != nil {
				return
			}
		}
		// -tags ferry_synth: with the test-only synth stage kind.
		build := exec.Command(goTool, "build", "-tags", "ferry_synth", "-o", binPath, "github.com/ferry-llm/ferry/cmd/ferry")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			binError = fmt.Errorf("building ferry: %v\n%s", err, out)
		}
	})
	if binError != nil {
		t.Fatal(binError)
	}
	return binPath
}

type result struct {
	code           int
	stdout, stderr string
}

func ferry(t testing.TB, args ...string) result {
	t.Helper()
	return ferryEnv(t, nil, args...)
}

// ferryEnv runs ferry with env added to the environment.
func ferryEnv(t testing.TB, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(ferryBinary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{code, out.String(), errb.String()}
}

func write(t testing.TB, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Each bad pipeline file gives one error line with file:line, exit 2, for
// run, plan and status, and nothing is written.
func TestCLIBadPipelineFiles(t *testing.T) {
	tests := []struct {
		name, src string
		line      int
		msg       string
	}{
		{"bad yaml", "name: x\nstages:\n  - name: a\n    import: { path: p }\n   bad: indent\n", 5, "invalid YAML"},
		{"unknown kind", "name: x\nstages:\n  - name: a\n    inport: { path: p }\n", 4, `unknown kind "inport"`},
		{"missing reference", "name: x\nstages:\n  - name: a\n    import: { path: p }\n  - name: m\n    merge: { base: a, adapter: ad }\n", 6, `unknown stage "ad"`},
		{"cycle", "name: x\nstages:\n  - name: a\n    synth: { size: 1, from: c }\n  - name: b\n    synth: { size: 1, from: a }\n  - name: c\n    synth: { size: 1, from: b }\n", 6, "dependency cycle: a -> c -> b -> a"},
		{"duplicate name", "name: x\nstages:\n  - name: a\n    import: { path: p }\n  - name: a\n    synth: { size: 1 }\n", 5, "duplicate stage name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "bad.yaml")
			write(t, p, tc.src)
			for _, sub := range []string{"run", "plan", "status"} {
				r := ferry(t, "pipeline", sub, p)
				if r.code != 2 {
					t.Errorf("%s: exit %d, want 2 (%s)", sub, r.code, r.stderr)
				}
				lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
				if len(lines) != 1 {
					t.Errorf("%s: want one error line, got %q", sub, r.stderr)
				}
				want := fmt.Sprintf("%s:%d:", p, tc.line)
				if !strings.Contains(lines[0], want) || !strings.Contains(lines[0], tc.msg) {
					t.Errorf("%s: error %q, want %q and %q", sub, lines[0], want, tc.msg)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, ".ferry")); !errors.Is(err, fs.ErrNotExist) {
				t.Error("a bad pipeline file created the store")
			}
		})
	}
}

func TestCLIRunPlanStatusJSON(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "m/config.json"), `{}`)
	p := filepath.Join(dir, "p.yaml")
	write(t, p, "name: j\nstages:\n  - name: m\n    import: { path: m }\n  - name: s\n    synth: { size: 1000, units: 4, from: m }\n")
	var rep pipeline.Report
	r := ferry(t, "pipeline", "plan", "--json", p)
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rep) != nil || rep.Stages[0].Action != "run" {
		t.Fatalf("plan --json: %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = ferry(t, "pipeline", "run", "--json", p)
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rep) != nil || rep.Stages[1].Action != "run" || len(rep.Stages[1].Outputs) != 1 {
		t.Fatalf("run --json: %d %q %q", r.code, r.stdout, r.stderr)
	}
	var st pipeline.StatusReport
	r = ferry(t, "pipeline", "status", "--json", p)
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil || st.Stages[1].State != "complete" || st.Stages[1].Outputs[0].Size != 1000 {
		t.Fatalf("status --json: %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = ferry(t, "pipeline", "status", p)
	if !strings.Contains(r.stdout, "s (synth): complete") || !strings.Contains(r.stdout, "synth.bin") {
		t.Errorf("status: %s", r.stdout)
	}
	r = ferry(t, "pipeline", "run", "--only", "nosuch", p)
	if r.code != 2 {
		t.Errorf("--only nosuch: exit %d %s", r.code, r.stderr)
	}
}

// store verify: exit 0 on a good store, 3 on a flipped byte and on a
// deleted blob; plan then names the stages that must re-run.
func TestCLIStoreVerify(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "m/a.bin"), strings.Repeat("a", 4096))
	write(t, filepath.Join(dir, "m/b.bin"), strings.Repeat("b", 4096))
	p := filepath.Join(dir, "p.yaml")
	write(t, p, "name: v\nstages:\n  - name: m\n    import: { path: m }\n  - name: s\n    synth: { size: 100000, units: 4, from: m }\n")
	if r := ferry(t, "pipeline", "run", p); r.code != 0 {
		t.Fatal(r.stderr)
	}
	if r := ferry(t, "store", "verify", p); r.code != 0 {
		t.Fatalf("clean store: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	store, _ := manifest.Load(filepath.Join(dir, ".ferry"))
	recs := map[string]*manifest.Record{}
	for _, r := range store.Records() {
		recs[r.Stage] = r
	}
	flip := func(d manifest.Digest) {
		bp := store.BlobPath(d)
		fi, _ := os.Stat(bp)
		os.Chmod(bp, 0o644)
		b, _ := os.ReadFile(bp)
		b[len(b)/2] ^= 0x01
		os.WriteFile(bp, b, 0o444)
		os.Chtimes(bp, fi.ModTime(), fi.ModTime())
	}

	// Flipped byte in the synth output.
	flip(recs["s"].Outputs[0].Digest)
	r := ferry(t, "store", "verify", filepath.Join(dir, ".ferry"))
	if r.code != 3 || !strings.Contains(r.stdout, "does not match its digest") {
		t.Fatalf("flipped byte: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = ferry(t, "pipeline", "plan", p)
	if !regexp.MustCompile(`(?m)^\s+s\s+synth\s+run\s+output synth.bin damaged`).MatchString(r.stdout) ||
		!regexp.MustCompile(`(?m)^\s+m\s+import\s+skip`).MatchString(r.stdout) {
		t.Errorf("plan after flip:\n%s", r.stdout)
	}
	if r := ferry(t, "pipeline", "run", p); r.code != 0 {
		t.Fatal(r.stderr)
	}
	if r := ferry(t, "store", "verify", p); r.code != 0 {
		t.Fatalf("after repair: exit %d %s", r.code, r.stdout)
	}

	// Deleted blob of an import output.
	os.Remove(store.BlobPath(recs["m"].Outputs[1].Digest))
	r = ferry(t, "store", "verify", p)
	if r.code != 3 || !strings.Contains(r.stdout, "blob missing") {
		t.Fatalf("deleted blob: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = ferry(t, "pipeline", "plan", p)
	if !regexp.MustCompile(`(?m)^\s+m\s+import\s+run\s+output b.bin (damaged \(missing\)|missing)`).MatchString(r.stdout) ||
		!regexp.MustCompile(`(?m)^\s+s\s+synth\s+pending`).MatchString(r.stdout) {
		t.Errorf("plan after delete:\n%s", r.stdout)
	}
	// A stage run alone (--only) whose input's blob vanished: damage, exit 3.
	if r := ferry(t, "pipeline", "run", "--only", "s", p); r.code != 3 || !strings.Contains(r.stderr, "stage m: output b.bin") {
		t.Errorf("--only s over a deleted input blob: exit %d %s", r.code, r.stderr)
	}
	if r := ferry(t, "pipeline", "run", p); r.code != 0 {
		t.Fatal(r.stderr)
	}
	if r := ferry(t, "store", "verify", p); r.code != 0 {
		t.Fatalf("after repair: exit %d %s", r.code, r.stdout)
	}
}

// Two runs on one store: the second fails with a clear lock message (or
// waits with --lock-wait); a lock left by a killed run is taken over.
func TestCLIConcurrentRunsAndStaleLock(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "p.yaml")
	write(t, p, "name: l\nstages:\n  - name: big\n    synth: { size: 192MiB, units: 96 }\n")
	lockPath := filepath.Join(dir, ".ferry", "lock")

	first := exec.Command(ferryBinary(t), "pipeline", "run", p)
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, err := os.Stat(lockPath); return err == nil })
	r := ferry(t, "pipeline", "run", p)
	if r.code != 1 || !strings.Contains(r.stderr, "store is locked by pid "+fmt.Sprint(first.Process.Pid)) {
		t.Errorf("second run: exit %d, stderr %q", r.code, r.stderr)
	}
	// --lock-wait waits for the first run, then finds everything done.
	r = ferry(t, "pipeline", "run", "--lock-wait", "2m", p)
	if r.code != 0 || !strings.Contains(r.stdout, "skip") {
		t.Errorf("waiting run: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	if err := first.Wait(); err != nil {
		t.Fatalf("first run: %v", err)
	}

	// Kill a run while it holds the lock: the next run takes it over.
	if r := ferry(t, "pipeline", "run", "--from", "big", p); r.code != 0 {
		t.Fatal(r.stderr)
	}
	killed := exec.Command(ferryBinary(t), "pipeline", "run", "--force", "big", p)
	if err := killed.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, err := os.Stat(lockPath); return err == nil })
	killed.Process.Signal(syscall.SIGKILL)
	killed.Wait()
	if _, err := os.Stat(lockPath); err != nil {
		t.Fatal("the killed run left no lock to test with")
	}
	r = ferry(t, "pipeline", "run", p)
	if r.code != 0 || !strings.Contains(r.stderr, "took over a stale store lock") {
		t.Errorf("after kill: exit %d\n%s", r.code, r.stderr)
	}
	if _, err := os.Stat(lockPath); !errors.Is(err, fs.ErrNotExist) {
		t.Error("lock not released")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

var unitLine = regexp.MustCompile(`msg="synth unit (begin|done)" stage=(\S+) unit=(\d+)`)

type unitEvent struct {
	begin bool
	stage string
	unit  string
}

func parseUnits(b []byte) []unitEvent {
	var out []unitEvent
	for _, m := range unitLine.FindAllSubmatch(b, -1) {
		out = append(out, unitEvent{begin: string(m[1]) == "begin", stage: string(m[2]), unit: string(m[3])})
	}
	return out
}

// The kill test: SIGKILL `ferry pipeline run` at 20 random moments (some at
// random times, some just inside a unit), re-run each time, and check that
// (1) no file under a final name is ever partial or wrong, (2) the final
// outputs are byte-identical to an uninterrupted run, (3) no unit that was
// durably finished is ever written again.
func TestKillResume(t *testing.T) {
	if testing.Short() {
		t.Skip("kill test writes ~250 MB per run; not in -short")
	}
	const spec = `name: kill
stages:
  - name: a
    synth: { size: 8MiB, units: 8, seed: 1, file: a.bin }
  - name: b
    synth: { size: 120MiB, units: 240, seed: 2, file: b.bin }
  - name: c
    synth: { size: 118MiB, units: 236, seed: 3, from: a, file: c.bin }
    out: out/c
`
	// Many small units: on a loaded machine a run may get far between
	// the moment the test decides to kill and the kill, and 20 kills must
	// all land before the work is done.
	const totalUnits = 484
	unitsOf := map[string]int{"a": 8, "b": 240, "c": 236}
	want := map[string]manifest.Digest{}
	var full time.Duration // the uninterrupted run: random kill times scale with it
	{
		ref := t.TempDir()
		write(t, filepath.Join(ref, "p.yaml"), spec)
		start := time.Now()
		r := ferry(t, "pipeline", "run", "--json", "-j", "2", filepath.Join(ref, "p.yaml"))
		full = time.Since(start)
		if r.code != 0 {
			t.Fatal(r.stderr)
		}
		var rep pipeline.Report
		json.Unmarshal([]byte(r.stdout), &rep)
		for _, s := range rep.Stages {
			want[s.Stage] = s.Outputs[0].Digest
		}
		os.RemoveAll(ref)
	}

	dir := t.TempDir()
	p := filepath.Join(dir, "p.yaml")
	write(t, p, spec)
	logPath := filepath.Join(dir, "stderr.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	checked := map[string]manifest.Stamp{} // blobs already re-hashed

	kills, inUnit := 0, 0
	killedStages := map[string]bool{}
	store := filepath.Join(dir, ".ferry")
	// durable[stage] = units the journal (or a record) holds as finished:
	// a later run must not begin any of them again.
	durable := map[string]int{}
	checkSegment := func(seg []byte, what string) {
		for _, e := range parseUnits(seg) {
			if u, _ := strconv.Atoi(e.unit); e.begin && u < durable[e.stage] {
				t.Errorf("%s: unit %s/%d began again, but %d units of %s were durably finished", what, e.stage, u, durable[e.stage], e.stage)
			}
		}
	}
	for attempt := 0; kills < 20; attempt++ {
		if attempt > 60 {
			t.Fatalf("only %d kills landed in %d attempts", kills, attempt)
		}
		logStart, _ := logf.Seek(0, 2)
		cmd := exec.Command(ferryBinary(t), "--verbose", "pipeline", "run", "-j", "2", p)
		cmd.Stdout, cmd.Stderr = nil, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		var finished bool
		// Where each kill lands. k is random up to the units left per kill
		// left, so the kills spread over the whole work and, on a loaded
		// machine, one attempt cannot do most of it (20 kills must land
		// before the work is done).
		//   attempt%4 == 0: a random moment early in the run (start-up,
		//     lock, journal reopen, first units), capped at k unit begins;
		//   attempt%4 == 2: a random moment up to 20 ms after the k-th unit
		//     of this run began (inside or between units, a commit);
		//   odd attempts: just after the k-th unit began (inside a unit).
		left := totalUnits
		for _, n := range durable {
			left -= n
		}
		k := 1 + rng.IntN(max(1, left/(20-kills+1)))
		var deadline time.Time
		var after time.Duration
		switch {
		case attempt%4 == 0:
			deadline = time.Now().Add(time.Duration(rng.Int64N(int64(full/20) + 1)))
		case attempt%4 == 2:
			after = time.Duration(rng.Int64N(int64(20 * time.Millisecond)))
		default:
			after = time.Duration(rng.IntN(3000)) * time.Microsecond
		}
		for !finished {
			if !deadline.IsZero() && !time.Now().Before(deadline) {
				break
			}
			b, _ := os.ReadFile(logPath)
			n := 0
			for _, e := range parseUnits(b[logStart:]) {
				if e.begin {
					n++
				}
			}
			if n >= k {
				time.Sleep(after)
				break
			}
			select {
			case <-exited:
				finished = true
			case <-time.After(500 * time.Microsecond):
			}
		}
		if finished {
			t.Fatalf("attempt %d: the run finished before it was killed (all work done after %d kills)", attempt, kills)
		}
		cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		kills++
		b, _ := os.ReadFile(logPath)
		checkSegment(b[logStart:], fmt.Sprintf("run %d", attempt))
		durableUnits(t, store, unitsOf, durable)
		open := map[string]bool{}
		for _, e := range parseUnits(b[logStart:]) {
			open[e.stage+"/"+e.unit] = e.begin
		}
		for k, v := range open {
			if v {
				inUnit++
				killedStages[strings.Split(k, "/")[0]] = true
			}
		}
		checkStore(t, filepath.Join(dir, ".ferry"), checked)
	}

	before := 0
	for _, n := range durable {
		before += n
	}
	t.Logf("after %d kills, %d of %d units were durable", kills, before, totalUnits)
	r := ferry(t, "--verbose", "pipeline", "run", "--json", "-j", "2", p)
	logf.WriteString(r.stderr)
	checkSegment([]byte(r.stderr), "final run")
	if r.code != 0 {
		t.Fatalf("final run: %s", r.stderr)
	}
	checkStore(t, filepath.Join(dir, ".ferry"), checked)
	var rep pipeline.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Stages {
		if len(s.Outputs) != 1 || s.Outputs[0].Digest != want[s.Stage] {
			t.Errorf("stage %s: outputs %+v, want digest %s", s.Stage, s.Outputs, want[s.Stage])
		}
	}
	// The out: view reads back the right bytes.
	if got, _, err := manifest.HashFile(filepath.Join(dir, "out/c/c.bin")); err != nil || got != want["c"] {
		t.Errorf("view out/c: %s %v", got, err)
	}

	// Finished units are never redone: besides the journal check above,
	// no unit begins again after its "done" line (logged once the unit is
	// durable), and every unit was written.
	b, _ := os.ReadFile(logPath)
	done := map[string]bool{}
	began := map[string]bool{}
	begins := 0
	for _, e := range parseUnits(b) {
		id := e.stage + "/" + e.unit
		if e.begin {
			begins++
			began[id] = true
			if done[id] {
				t.Errorf("unit %s was finished, then written again", id)
			}
		} else {
			done[id] = true
		}
	}
	if len(began) != totalUnits {
		t.Errorf("%d units written, want %d", len(began), totalUnits)
	}
	// Each kill can cut at most one unit per running stage (-j 2).
	if redone := begins - totalUnits; redone > 2*kills {
		t.Errorf("%d unit writes for %d units with %d kills", begins, totalUnits, kills)
	}
	t.Logf("%d kills (%d inside a unit, stages %v); %d unit writes for %d units", kills, inUnit, keys(killedStages), begins, totalUnits)
	if inUnit < 5 || len(killedStages) < 2 {
		t.Errorf("kills did not land inside units across stages: %d in units, stages %v", inUnit, keys(killedStages))
	}
}

// durableUnits reads the resume journals and the manifest after a kill and
// raises durable[stage] to the number of units they hold as finished.
func durableUnits(t *testing.T, store string, unitsOf map[string]int, durable map[string]int) {
	t.Helper()
	journals, _ := filepath.Glob(filepath.Join(store, "ingest", "*", "*", "journal"))
	for _, jp := range journals {
		b, err := os.ReadFile(jp)
		if err != nil {
			continue // removed after its stage committed
		}
		stage, n := "", 0
		for _, line := range strings.Split(string(b), "\n") {
			var l struct {
				Ref, Unit, Commit string
			}
			if json.Unmarshal([]byte(line), &l) != nil {
				break // torn last line
			}
			switch {
			case l.Ref != "":
				stage = strings.TrimSuffix(l.Ref, ".bin")
			case l.Unit != "":
				n++
			case l.Commit != "":
				n = unitsOf[stage]
			}
		}
		if n > durable[stage] {
			durable[stage] = n
		}
	}
	s, err := manifest.Load(store)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range s.Records() {
		durable[r.Stage] = unitsOf[r.Stage]
	}
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// checkStore asserts what a kill may never leave: a blob whose bytes do not
// hash to its name, a manifest that does not parse, a record naming a blob
// that is not there, a view link that does not resolve.
func checkStore(t *testing.T, root string, checked map[string]manifest.Stamp) {
	t.Helper()
	entries, _ := os.ReadDir(filepath.Join(root, "blobs", "sha256"))
	for _, e := range entries {
		p := filepath.Join(root, "blobs", "sha256", e.Name())
		st, err := manifest.StatStamp(p)
		if err != nil {
			t.Fatal(err)
		}
		if checked[e.Name()] == st {
			continue
		}
		d, _, err := manifest.HashFile(p)
		if err != nil || d.Hex() != e.Name() {
			t.Fatalf("blob %s is partial or wrong (hashes to %s)", e.Name(), d)
		}
		checked[e.Name()] = st
	}
	s, err := manifest.Load(root)
	if err != nil {
		t.Fatalf("manifest after kill: %v", err)
	}
	for _, r := range s.Records() {
		for _, o := range r.Outputs {
			fi, err := os.Stat(s.BlobPath(o.Digest))
			if err != nil || fi.Size() != o.Size {
				t.Fatalf("record %s output %s: dangling (%v)", r.Stage, o.Path, err)
			}
		}
	}
	filepath.WalkDir(filepath.Join(root, "views"), func(p string, de fs.DirEntry, err error) error {
		if err == nil && de.Type()&fs.ModeSymlink != 0 {
			if _, err := os.Stat(p); err != nil {
				t.Fatalf("view link %s does not resolve: %v", p, err)
			}
		}
		return nil
	})
}

// BenchmarkDemoNoopRerunCLI: `ferry pipeline run` (the binary, process
// start included) on the finished demo pipeline. Reports seconds per
// stage (acceptance: < 1 s) and the ratio to the first, full run of the
// same binary in the same benchmark (the anchor).
func BenchmarkDemoNoopRerunCLI(b *testing.B) {
	src, err := os.ReadFile("../pipelines/demo.yaml")
	if err != nil {
		b.Fatal(err)
	}
	td, _ := filepath.Abs("../testdata")
	p := filepath.Join(b.TempDir(), "demo.yaml")
	write(b, p, strings.ReplaceAll(string(src), "../testdata/", td+"/"))
	spec, err := pipeline.Load(p)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if r := ferry(b, "pipeline", "run", p); r.code != 0 {
		b.Fatal(r.stderr)
	}
	full := time.Since(start)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := ferry(b, "pipeline", "run", "--json", p)
		var rep pipeline.Report
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rep) != nil {
			b.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		for _, s := range rep.Stages {
			if s.Action != pipeline.ActionSkip {
				b.Fatalf("stage %s: %s (%s)", s.Stage, s.Action, s.Reason)
			}
		}
	}
	b.StopTimer()
	per := b.Elapsed().Seconds() / float64(b.N)
	stages := float64(len(spec.Stages))
	b.ReportMetric(per/stages, "s/stage")
	b.ReportMetric(per/full.Seconds(), "x_full_run")
	if per/stages >= 1 {
		b.Errorf("no-op re-run takes %.3f s per stage, want < 1 s", per/stages)
	}
}

// store gc keeps every blob a record refers to; with --prune-records it
// first drops records of old parameters, and their blobs go.
func TestCLIStoreGC(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "p.yaml")
	write(t, p, "name: g\nstages:\n  - name: s\n    synth: { size: 4096, seed: 1 }\n")
	if r := ferry(t, "pipeline", "run", p); r.code != 0 {
		t.Fatal(r.stderr)
	}
	write(t, p, "name: g\nstages:\n  - name: s\n    synth: { size: 4096, seed: 2 }\n")
	if r := ferry(t, "pipeline", "run", p); r.code != 0 {
		t.Fatal(r.stderr)
	}
	blobs := func() int {
		e, _ := os.ReadDir(filepath.Join(dir, ".ferry", "blobs", "sha256"))
		return len(e)
	}
	if n := blobs(); n != 2 {
		t.Fatalf("%d blobs, want 2", n)
	}
	var g manifest.GCReport
	r := ferry(t, "store", "gc", "--json", p)
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &g) != nil || g.RemovedBlobs != 0 || blobs() != 2 {
		t.Fatalf("gc: %d %s %s", r.code, r.stdout, r.stderr)
	}
	r = ferry(t, "store", "gc", "--prune-records", "--json", p)
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &g) != nil || g.PrunedRecords != 1 || g.RemovedBlobs != 1 || blobs() != 1 {
		t.Fatalf("gc --prune-records: %d %s %s", r.code, r.stdout, r.stderr)
	}
	if r := ferry(t, "pipeline", "run", p); r.code != 0 || !strings.Contains(r.stdout, "skip") {
		t.Errorf("after gc the current stage must still be up to date: %s", r.stdout)
	}
	if r := ferry(t, "store", "verify", p); r.code != 0 {
		t.Errorf("verify after gc: %s", r.stdout)
	}
}

// The real stages under SIGKILL: the demo pipeline (import, merge, gguf,
// verify_mtp) killed at random moments, re-run each time, ends with the
// outputs of an uninterrupted run, and no kill leaves a partial or wrong
// blob, a dangling record or a broken view.
func TestKillResumeDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("not in -short")
	}
	src, err := os.ReadFile("../pipelines/demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	td, _ := filepath.Abs("../testdata")
	spec := strings.ReplaceAll(string(src), "../testdata/", td+"/")
	outputs := func(stdout string) map[string]manifest.Digest {
		var rep pipeline.Report
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
			t.Fatalf("%v: %q", err, stdout)
		}
		m := map[string]manifest.Digest{}
		for _, s := range rep.Stages {
			m[s.Stage] = manifest.OutputsDigest(s.Outputs)
		}
		return m
	}
	ref := filepath.Join(t.TempDir(), "demo.yaml")
	write(t, ref, spec)
	start := time.Now()
	r := ferry(t, "pipeline", "run", "--json", ref)
	full := time.Since(start)
	if r.code != 0 {
		t.Fatal(r.stderr)
	}
	want := outputs(r.stdout)

	dir := t.TempDir()
	p := filepath.Join(dir, "demo.yaml")
	write(t, p, spec)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d, uninterrupted run %v", seed, full)
	rng := rand.New(rand.NewPCG(seed, 0xde70))
	checked := map[string]manifest.Stamp{}
	for kill := 0; kill < 8; kill++ {
		cmd := exec.Command(ferryBinary(t), "pipeline", "run", p)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rng.Int64N(int64(full))))
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		checkStore(t, filepath.Join(dir, ".ferry"), checked)
	}
	r = ferry(t, "pipeline", "run", "--json", p)
	if r.code != 0 {
		t.Fatal(r.stderr)
	}
	checkStore(t, filepath.Join(dir, ".ferry"), checked)
	got := outputs(r.stdout)
	for st, d := range want {
		if got[st] != d {
			t.Errorf("stage %s: outputs differ from the uninterrupted run", st)
		}
	}
	if r := ferry(t, "store", "verify", p); r.code != 0 {
		t.Errorf("store verify after the kills: %s", r.stdout)
	}
}

func TestCLIStoreArgs(t *testing.T) {
	dir := t.TempDir()
	if r := ferry(t, "store", "verify", dir); r.code != 2 || !strings.Contains(r.stderr, "not a ferry store") {
		t.Errorf("empty dir: exit %d %q", r.code, r.stderr)
	}
	if r := ferry(t, "store", "gc", filepath.Join(dir, "nope")); r.code != 2 {
		t.Errorf("missing path: exit %d %q", r.code, r.stderr)
	}
	if r := ferry(t, "store", "verify"); r.code != 2 {
		t.Errorf("no argument: exit %d %q", r.code, r.stderr)
	}
	p := filepath.Join(dir, "p.yaml")
	write(t, p, "name: a\nstages:\n  - name: s\n    synth: { size: 10 }\n")
	if r := ferry(t, "pipeline", "run", p); r.code != 0 {
		t.Fatal(r.stderr)
	}
	// A store held by a live run: verify says who holds it.
	write(t, filepath.Join(dir, ".ferry", "lock"), fmt.Sprintf(`{"pid":%d,"host":%q,"started":"2026-01-01T00:00:00Z","command":"test"}`, os.Getpid(), hostname(t)))
	if r := ferry(t, "store", "verify", p); r.code != 1 || !strings.Contains(r.stderr, fmt.Sprintf("store is locked by pid %d", os.Getpid())) {
		t.Errorf("locked store: exit %d %q", r.code, r.stderr)
	}
}

func hostname(t *testing.T) string {
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return h
}
