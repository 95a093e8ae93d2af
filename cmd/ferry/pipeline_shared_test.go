package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ferry-llm/ferry/internal/s3test"
	"github.com/ferry-llm/ferry/pipeline"
)

// sharedMachine is one "machine" of a shared-store test: a directory of
// its own with a copy of the bundled model and the demo pipeline file (so
// its imports read other paths than the other machine's, and its out:
// views land in its own directory), and a cache of its own.
type sharedMachine struct {
	name, dir, file, cache string
}

// machinesOnBucket starts a versitygw with bucket and writes the demo
// pipeline for machine-a and machine-b on s3://bucket/team.
func machinesOnBucket(t *testing.T, bucket string) (*s3test.Server, string, sharedMachine, sharedMachine) {
	t.Helper()
	srv := s3test.Start(t, bucket)
	srv.Env(t)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	url := "s3://" + bucket + "/team"
	root := t.TempDir()
	return srv, url, newSharedMachine(t, root, "machine-a", url), newSharedMachine(t, root, "machine-b", url)
}

// newSharedMachine writes the demo pipeline under root/name on store.
func newSharedMachine(t *testing.T, root, name, store string) sharedMachine {
	t.Helper()
	m := sharedMachine{name: name, dir: filepath.Join(root, name)}
	models := filepath.Join(m.dir, "models")
	for _, sub := range []string{"base", "adapter-dora"} {
		copyTree(t, filepath.Join("..", "..", "testdata", "models", "qwen35-tiny", sub), filepath.Join(models, sub))
	}
	body, err := os.ReadFile(filepath.Join("..", "..", "pipelines", "demo.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	s := strings.ReplaceAll(string(body), "../testdata/models/qwen35-tiny/", "models/")
	s = strings.Replace(s, "store: .ferry", "store: "+store, 1)
	m.file = filepath.Join(m.dir, "demo.yaml")
	if err := os.WriteFile(m.file, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	m.cache = filepath.Join(m.dir, "cache")
	return m
}

func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		out := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(out, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(out, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// startRun starts `ferry pipeline run --events` of m; its events arrive
// on the returned channel, which is closed when stdout ends.
func (m sharedMachine) startRun(t *testing.T, extra ...string) (*exec.Cmd, <-chan pipeline.Event, *bytes.Buffer) {
	t.Helper()
	args := append([]string{"pipeline", "run", "--events", "--cache", m.cache, "--machine", m.name, "-j", "2"}, extra...)
	args = append(args, m.file)
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "FERRY_INSPECT_TEST_AS_MAIN=1")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := make(chan pipeline.Event, 256)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var e pipeline.Event
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				ch <- e
			}
		}
		io.Copy(io.Discard, out)
	}()
	return cmd, ch, &errb
}

// collect reads every event of a run and waits for it to end.
func collect(t *testing.T, m sharedMachine, cmd *exec.Cmd, ch <-chan pipeline.Event, errb *bytes.Buffer) ([]pipeline.Event, int) {
	t.Helper()
	var evs []pipeline.Event
	for e := range ch {
		evs = append(evs, e)
	}
	err := cmd.Wait()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("machine %s: %v", m.name, err)
	}
	if code != 0 {
		t.Logf("machine %s: exit %d, stderr:\n%s", m.name, code, errb)
	}
	return evs, code
}

// byStage maps stage → the events of that stage, as "event reason".
func byStage(evs []pipeline.Event, kinds ...pipeline.EventType) map[string][]pipeline.Event {
	out := map[string][]pipeline.Event{}
	for _, e := range evs {
		for _, k := range kinds {
			if e.Event == k && e.Stage != "" {
				out[e.Stage] = append(out[e.Stage], e)
			}
		}
	}
	return out
}

// viewFiles reads every file of the pipeline's out: views under dir/out,
// through their links.
func viewFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	root := filepath.Join(dir, "out")
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		files[rel] = b
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func sameFiles(t *testing.T, what string, got, want map[string][]byte) {
	t.Helper()
	var names []string
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(got) != len(want) || len(want) == 0 {
		t.Errorf("%s: %d files, want %d", what, len(got), len(want))
	}
	for _, n := range names {
		if !bytes.Equal(got[n], want[n]) {
			t.Errorf("%s: %s differs from the local-store run's", what, n)
		}
	}
}

// Two machines, one store: two `ferry pipeline run` processes with caches,
// work dirs and model copies of their own, started together on the same
// pipeline against one s3:// store on a real versitygw. Every stage but
// the imports (each machine reads its own files) runs exactly once in
// total; the other machine waits on the lease or finds the record, and
// skips naming the machine that made it; the outputs are byte-identical to
// a local-store run's; `ferry store verify` passes; a second run of each
// machine runs nothing.
func TestPipelineSharedTwoMachines(t *testing.T) {
	t.Run("s3", func(t *testing.T) {
		srv := s3test.Start(t, "ferry-two")
		srv.Env(t)
		twoMachines(t, "s3://ferry-two/team", "s3://ferry-two/team")
	})
	// The same on a directory both mount (NFS, a shared disk): store/local.
	t.Run("file", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "shared")
		twoMachines(t, "file://"+dir, dir)
	})
}

func twoMachines(t *testing.T, url, verifyArg string) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	root := t.TempDir()
	a := newSharedMachine(t, root, "machine-a", url)
	b := newSharedMachine(t, root, "machine-b", url)

	cmdA, chA, errA := a.startRun(t, "--lease-ttl", "3s")
	cmdB, chB, errB := b.startRun(t, "--lease-ttl", "3s")
	type result struct {
		evs  []pipeline.Event
		code int
	}
	resB := make(chan result, 1)
	go func() {
		evs, code := collect(t, b, cmdB, chB, errB)
		resB <- result{evs, code}
	}()
	evA, codeA := collect(t, a, cmdA, chA, errA)
	rb := <-resB
	if codeA != 0 || rb.code != 0 {
		t.Fatalf("exit codes %d and %d", codeA, rb.code)
	}
	runs := map[string]int{}
	for _, evs := range [][]pipeline.Event{evA, rb.evs} {
		for st, es := range byStage(evs, pipeline.EventRun) {
			runs[st] += len(es)
		}
	}
	skips := map[string][]pipeline.Event{}
	for m, evs := range map[string][]pipeline.Event{a.name: evA, b.name: rb.evs} {
		for st, es := range byStage(evs, pipeline.EventSkip) {
			for _, e := range es {
				if !strings.Contains(e.Reason, "made on machine-") || strings.Contains(e.Reason, "made on "+m) {
					t.Errorf("machine %s: stage %s skipped with %q, want the other machine named", m, st, e.Reason)
				}
				skips[st] = append(skips[st], e)
			}
		}
	}
	for _, st := range []string{"merged", "f16", "quants", "checked"} {
		if runs[st] != 1 || len(skips[st]) != 1 {
			t.Errorf("stage %s ran %d times and was skipped %d times across both machines, want 1 and 1", st, runs[st], len(skips[st]))
		}
	}
	// Each machine shares what it ran, once, and nothing else: the
	// imports stay where they were read.
	for m, evs := range map[string][]pipeline.Event{a.name: evA, b.name: rb.evs} {
		ran, shared := byStage(evs, pipeline.EventRun), byStage(evs, pipeline.EventShared)
		for _, st := range []string{"base", "adapter", "merged", "f16", "quants", "checked"} {
			want := len(ran[st])
			if st == "base" || st == "adapter" {
				want = 0
			}
			if len(shared[st]) != want {
				t.Errorf("machine %s: stage %s ran %d times, shared %d times, want %d", m, st, len(ran[st]), len(shared[st]), want)
			}
			for _, e := range shared[st] {
				if !strings.HasPrefix(e.Reason, "shared to ") || e.Bytes <= 0 {
					t.Errorf("machine %s: stage %s's shared event: %+v", m, st, e)
				}
			}
			// Its upload's progress, apart from its own: the last line
			// has every byte it shared.
			var last *pipeline.Event
			for _, e := range byStage(evs, pipeline.EventProgress)[st] {
				if e.Phase == pipeline.PhaseShare {
					last = &e
				}
			}
			switch {
			case want == 0 && last != nil:
				t.Errorf("machine %s: stage %s, not shared, has upload progress %+v", m, st, *last)
			case want > 0 && (last == nil || last.Bytes != shared[st][0].Bytes || last.Of != last.Bytes):
				t.Errorf("machine %s: stage %s shared %d bytes; its last upload progress: %+v", m, st, shared[st][0].Bytes, last)
			}
		}
	}
	for _, st := range []string{"base", "adapter"} {
		if runs[st] != 2 {
			t.Errorf("import %s ran %d times, want once per machine", st, runs[st])
		}
	}

	// The same pipeline on a local store: the same bytes everywhere.
	loc := newSharedMachine(t, root, "local", ".ferry")
	if r := execFerry(t, nil, "pipeline", "run", "-j", "2", loc.file); r.code != 0 {
		t.Fatalf("local run: exit %d\n%s", r.code, r.stderr)
	}
	want := viewFiles(t, loc.dir)
	sameFiles(t, "machine-a", viewFiles(t, a.dir), want)
	sameFiles(t, "machine-b", viewFiles(t, b.dir), want)

	if r := execFerry(t, nil, "store", "verify", verifyArg); r.code != 0 || !strings.Contains(r.stdout, " 0 unreferenced blobs") {
		t.Fatalf("store verify: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// Again on each machine: all up to date, nothing run or fetched.
	for _, m := range []sharedMachine{a, b} {
		cmd, ch, errb := m.startRun(t)
		evs, code := collect(t, m, cmd, ch, errb)
		if code != 0 {
			t.Fatalf("second run on %s: exit %d", m.name, code)
		}
		if n := len(byStage(evs, pipeline.EventRun)); n != 0 {
			t.Errorf("second run on %s ran %d stages", m.name, n)
		}
		for st, es := range byStage(evs, pipeline.EventSkip) {
			if es[0].Reason != "up to date" {
				t.Errorf("second run on %s: stage %s: %q, want up to date", m.name, st, es[0].Reason)
			}
		}
	}
}

// kill -9 of a machine while it holds the merge lease: the other machine
// waits (being made on the dead one, lease until T), takes the lease over
// after its ttl, runs the merge and finishes (a plan meanwhile says who
// makes it); `ferry store verify`
// passes; the killed machine's next run fetches what the other made.
func TestPipelineSharedTakeover(t *testing.T) {
	srv, url, a, b := machinesOnBucket(t, "ferry-kill")

	// machine-a's lease holds 6 s: time for machine-b to import and plan
	// while it is held, and to start waiting on it.
	cmdA, chA, errA := a.startRun(t, "--lease-ttl", "6s")
	stopped := false
	for e := range chA {
		if e.Event == pipeline.EventRun && e.Stage == "merged" {
			// Frozen at once (it holds the lease and renews it no more),
			// then killed: a machine that died mid-merge.
			if err := cmdA.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			stopped = true
			break
		}
	}
	if !stopped {
		collect(t, a, cmdA, chA, errA)
		t.Fatalf("machine-a never started the merge")
	}
	ctx := context.Background()
	cl := srv.Client()
	if _, err := cl.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("ferry-kill"), Key: aws.String("team/refs/pipelines/demo/merged")}); err == nil {
		t.Fatalf("the merge was shared before machine-a could be stopped: the test needs a slower merge")
	}
	leases := 0
	p := s3.NewListObjectsV2Paginator(cl, &s3.ListObjectsV2Input{Bucket: aws.String("ferry-kill"), Prefix: aws.String("team/leases/stage/")})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		leases += len(page.Contents)
	}
	if leases != 1 {
		t.Fatalf("%d stage leases while machine-a merges, want 1", leases)
	}
	// Meanwhile machine-b imports its files and plans: the merge is being
	// made on machine-a.
	for _, st := range []string{"base", "adapter"} {
		if r := execFerry(t, nil, "pipeline", "run", "--only", st, "--cache", b.cache, b.file); r.code != 0 {
			t.Fatalf("--only %s: exit %d\n%s", st, r.code, r.stderr)
		}
	}
	r := execFerry(t, nil, "pipeline", "plan", "--json", "--cache", b.cache, b.file)
	var rep pipeline.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || r.code != 0 {
		t.Fatalf("plan: exit %d, %v\n%s", r.code, err, r.stderr)
	}
	for _, sr := range rep.Stages {
		if sr.Stage == "merged" && (sr.Action != pipeline.ActionRun || !strings.Contains(sr.Reason, "being made on machine-a (lease until ") || sr.Host != "machine-a") {
			t.Errorf("plan while machine-a merges: %+v", sr)
		}
	}
	cmdA.Process.Kill()
	collect(t, a, cmdA, chA, errA)

	start := time.Now()
	cmdB, chB, errB := b.startRun(t, "--lease-ttl", "3s")
	evB, code := collect(t, b, cmdB, chB, errB)
	if code != 0 {
		t.Fatalf("machine-b: exit %d", code)
	}
	waits := byStage(evB, pipeline.EventWaiting)["merged"]
	if len(waits) == 0 || waits[0].Holder != "machine-a" || !strings.HasPrefix(waits[0].Reason, "being made on machine-a, lease until ") || waits[0].Until == nil {
		t.Fatalf("machine-b's waiting events for merged: %+v", waits)
	}
	if n := len(byStage(evB, pipeline.EventRun)["merged"]); n != 1 {
		t.Fatalf("machine-b ran merged %d times, want 1 (after taking the lease over)", n)
	}
	t.Logf("machine-b took over and finished in %v", time.Since(start).Round(time.Millisecond))
	if r := execFerry(t, nil, "store", "verify", url); r.code != 0 {
		t.Fatalf("store verify: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// machine-a comes back: what machine-b made is fetched, not run.
	cmdA, chA, errA = a.startRun(t, "--lease-ttl", "3s")
	evA, code := collect(t, a, cmdA, chA, errA)
	if code != 0 {
		t.Fatalf("machine-a again: exit %d", code)
	}
	for _, st := range []string{"merged", "f16", "quants", "checked"} {
		es := byStage(evA, pipeline.EventSkip)[st]
		if len(es) != 1 || !strings.HasPrefix(es[0].Reason, "made on machine-b") {
			t.Errorf("machine-a again: stage %s: %v, want skipped as made on machine-b", st, es)
		}
	}
	sameFiles(t, "machine-a", viewFiles(t, a.dir), viewFiles(t, b.dir))
}

// Ctrl-C gives a stage's lease back: the other machine starts the stage
// at once instead of waiting for the ttl. kill -9 leaves it held for
// every other machine, but the killed machine's next run (its cache)
// takes it over at once and resumes.
func TestPipelineSharedInterruptRestart(t *testing.T) {
	_, url, a, b := machinesOnBucket(t, "ferry-restart")
	// A ttl no run here may wait for.
	const ttl = "2m"
	stopAtMerge := func(m sharedMachine, sig syscall.Signal) int {
		t.Helper()
		cmd, ch, errb := m.startRun(t, "--lease-ttl", ttl)
		for e := range ch {
			if e.Event == pipeline.EventRun && e.Stage == "merged" {
				if err := cmd.Process.Signal(sig); err != nil {
					t.Fatal(err)
				}
				break
			}
		}
		_, code := collect(t, m, cmd, ch, errb)
		return code
	}
	if code := stopAtMerge(a, syscall.SIGINT); code != exitInterrupted {
		t.Fatalf("machine-a after Ctrl-C: exit %d", code)
	}
	start := time.Now()
	if code := stopAtMerge(b, syscall.SIGKILL); code != -1 {
		t.Fatalf("machine-b after kill -9: exit %d", code)
	}
	if waited := time.Since(start); waited > time.Minute {
		t.Fatalf("machine-b waited %v for machine-a's lease after its Ctrl-C", waited)
	}
	// machine-a waits for the dead machine-b; machine-b's next run does not.
	cmdA, chA, errA := a.startRun(t, "--lease-ttl", ttl)
	cmdB, chB, errB := b.startRun(t, "--lease-ttl", ttl)
	evB, code := collect(t, b, cmdB, chB, errB)
	if code != 0 {
		t.Fatalf("machine-b's next run: exit %d", code)
	}
	if w := byStage(evB, pipeline.EventWaiting)["merged"]; len(w) != 0 {
		t.Errorf("machine-b's next run waited for its own killed run's lease: %+v", w)
	}
	if n := len(byStage(evB, pipeline.EventRun)["merged"]); n != 1 {
		t.Errorf("machine-b's next run ran merged %d times, want 1", n)
	}
	evA, code := collect(t, a, cmdA, chA, errA)
	if code != 0 {
		t.Fatalf("machine-a: exit %d", code)
	}
	if es := byStage(evA, pipeline.EventSkip)["merged"]; len(es) != 1 || !strings.HasPrefix(es[0].Reason, "made on machine-b") {
		t.Errorf("machine-a: merged %+v, want fetched as made on machine-b", es)
	}
	// What its interrupted merge left is garbage once the stage is
	// fetched: nothing stays to resume.
	for _, d := range []string{"work", "ingest"} {
		if ents, _ := os.ReadDir(filepath.Join(a.cache, d)); len(ents) != 0 {
			t.Errorf("machine-a's cache keeps %s/%s after fetching the stage", d, ents[0].Name())
		}
	}
	if r := execFerry(t, nil, "store", "verify", url); r.code != 0 {
		t.Fatalf("store verify: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// A machine that ran the pipeline on a local store seeds the bucket by
// running it once against the bucket with its old store as the cache:
// nothing re-runs, everything is uploaded. Another machine's plan then
// shows those stages as fetch, and a machine without the model files runs
// one stage with --only, its input taken from the bucket.
func TestPipelineSharedSeedPlanOnly(t *testing.T) {
	srv := s3test.Start(t, "ferry-seed")
	srv.Env(t)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	const url = "s3://ferry-seed/team"
	root := t.TempDir()
	gpu := newSharedMachine(t, root, "gpu", ".ferry")
	// Its records name the machine that made them (--machine; the host
	// name without it), and keep that name when shared later.
	if r := execFerry(t, nil, "pipeline", "run", "-j", "2", "--machine", "gpu", gpu.file); r.code != 0 {
		t.Fatalf("local run: exit %d\n%s", r.code, r.stderr)
	}
	body, err := os.ReadFile(gpu.file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gpu.file, bytes.Replace(body, []byte("store: .ferry"), []byte("store: "+url), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	gpu.cache = filepath.Join(gpu.dir, ".ferry")
	cmd, ch, errb := gpu.startRun(t)
	evs, code := collect(t, gpu, cmd, ch, errb)
	if code != 0 {
		t.Fatalf("seeding run: exit %d", code)
	}
	if n := len(byStage(evs, pipeline.EventRun)); n != 0 {
		t.Errorf("seeding run ran %d stages, want none", n)
	}

	mac := newSharedMachine(t, root, "mac", url)
	// Keys follow the imported bytes: the plan knows them once this
	// machine has imported its files.
	for _, st := range []string{"base", "adapter"} {
		if r := execFerry(t, nil, "pipeline", "run", "--only", st, "--cache", mac.cache, mac.file); r.code != 0 {
			t.Fatalf("--only %s: exit %d\n%s", st, r.code, r.stderr)
		}
	}
	r := execFerry(t, nil, "pipeline", "plan", "--json", "--cache", mac.cache, mac.file)
	if r.code != 0 {
		t.Fatalf("plan: exit %d\n%s", r.code, r.stderr)
	}
	var rep pipeline.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	want := map[string]pipeline.Action{"base": pipeline.ActionSkip, "adapter": pipeline.ActionSkip,
		"merged": pipeline.ActionFetch, "f16": pipeline.ActionFetch, "quants": pipeline.ActionFetch, "checked": pipeline.ActionFetch}
	for _, s := range rep.Stages {
		if s.Action != want[s.Stage] || s.Action == pipeline.ActionFetch && s.Host != "gpu" {
			t.Errorf("plan: %s: %s (%s) host %q, want %s made on gpu", s.Stage, s.Action, s.Reason, s.Host, want[s.Stage])
		}
	}
	if rep.Store != url || rep.Cache != mac.cache {
		t.Errorf("plan: store %q cache %q", rep.Store, rep.Cache)
	}

	// A machine without the model files: only the quants, their input
	// from the bucket.
	mac = newSharedMachine(t, root, "mac2", url)
	if err := os.RemoveAll(filepath.Join(mac.dir, "models")); err != nil {
		t.Fatal(err)
	}
	// Its status: nothing here, everything but the imports in the bucket.
	r = execFerry(t, nil, "pipeline", "status", "--json", "--cache", mac.cache, mac.file)
	var st pipeline.StatusReport
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || r.code != 0 {
		t.Fatalf("status: exit %d, %v\n%s", r.code, err, r.stderr)
	}
	if st.Shared != url || st.Store != mac.cache {
		t.Errorf("status: store %q, shared %q", st.Store, st.Shared)
	}
	for _, s := range st.Stages {
		made := s.Shared != nil && s.Shared.Host == "gpu" && !s.Shared.Same && s.Shared.Key != ""
		if s.State != pipeline.StateNeverRun || made == (s.Kind == "import") {
			t.Errorf("status: %s: %s, in the bucket %+v", s.Stage, s.State, s.Shared)
		}
	}
	// Without the bucket (refused, offline) this machine's part prints;
	// the exit code says the rest is missing.
	if r := execFerry(t, []string{"AWS_SECRET_ACCESS_KEY=wrong"}, "pipeline", "status", "--cache", mac.cache, mac.file); r.code != 2 || !strings.Contains(r.stderr, "credentials") || !strings.Contains(r.stdout, "merged (merge): never-run") {
		t.Errorf("status with wrong credentials: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// A pipeline file on a shared store names that store to store commands.
	if r := execFerry(t, nil, "store", "du", mac.file); r.code != 0 || !strings.Contains(r.stdout, "store "+url+": ") {
		t.Errorf("store du of the pipeline file: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// Its plan says what a run does: the input from the bucket.
	r = execFerry(t, nil, "pipeline", "plan", "--json", "--only", "quants", "--cache", mac.cache, mac.file)
	var only pipeline.Report
	if err := json.Unmarshal([]byte(r.stdout), &only); err != nil || r.code != 0 {
		t.Fatalf("plan --only quants: exit %d, %v\n%s", r.code, err, r.stderr)
	}
	for _, s := range only.Stages {
		switch s.Stage {
		case "f16":
			if s.Action != pipeline.ActionNotSelected || s.Host != "gpu" || !strings.Contains(s.Reason, "is fetched by a run") {
				t.Errorf("plan --only quants: input f16: %+v", s)
			}
		case "quants":
			if s.Action != pipeline.ActionFetch || s.Host != "gpu" {
				t.Errorf("plan --only quants: %+v", s)
			}
		}
	}
	cmd, ch, errb = mac.startRun(t, "--only", "quants")
	evs, code = collect(t, mac, cmd, ch, errb)
	if code != 0 {
		t.Fatalf("--only quants: exit %d", code)
	}
	if es := byStage(evs, pipeline.EventSkip)["quants"]; len(es) != 1 || !strings.HasPrefix(es[0].Reason, "made on gpu") {
		t.Errorf("--only quants: %v", es)
	}
	got, want2 := viewFiles(t, mac.dir), viewFiles(t, gpu.dir)
	for n, b := range got {
		if !bytes.Equal(b, want2[n]) {
			t.Errorf("%s differs from the seeding machine's", n)
		}
	}
	if _, ok := got[filepath.Join("quants", "Merged-3.7M-Q4_K_M.gguf")]; !ok {
		t.Errorf("the Mac has no quants view: %d files", len(got))
	}
	// quants was fetched whole: its input f16 was not (a 27B F16 is
	// three times the Q4_K_M a Mac wants).
	f16View := "gguf" + string(filepath.Separator) // demo.yaml's out: of f16
	for n := range want2 {
		if strings.HasPrefix(n, f16View) {
			if _, ok := got[n]; ok {
				t.Errorf("--only quants, fetched: f16 was fetched too (%s)", n)
			}
		}
	}
	r = execFerry(t, nil, "pipeline", "status", "--json", "--cache", mac.cache, mac.file)
	var after pipeline.StatusReport
	if err := json.Unmarshal([]byte(r.stdout), &after); err != nil || r.code != 0 {
		t.Fatalf("status: exit %d, %v\n%s", r.code, err, r.stderr)
	}
	for _, s := range after.Stages {
		if want := map[string]pipeline.State{"f16": pipeline.StateNeverRun, "quants": pipeline.StateComplete}[s.Stage]; want != "" && s.State != want {
			t.Errorf("after --only quants: %s is %s, want %s", s.Stage, s.State, want)
		}
	}
	// Made here again (forced): now its input is fetched, and the bytes
	// are the same.
	cmd, ch, errb = mac.startRun(t, "--only", "quants", "--force", "quants")
	evs, code = collect(t, mac, cmd, ch, errb)
	if code != 0 || len(byStage(evs, pipeline.EventRun)["quants"]) != 1 {
		t.Fatalf("--only quants --force quants: exit %d, runs %v", code, byStage(evs, pipeline.EventRun))
	}
	got = viewFiles(t, mac.dir)
	for n, b := range got {
		if !bytes.Equal(b, want2[n]) {
			t.Errorf("%s differs from the seeding machine's after a forced run", n)
		}
	}
	for n := range want2 {
		if _, ok := got[n]; strings.HasPrefix(n, f16View) && !ok {
			t.Errorf("the forced run's input f16 has no view of %s", n)
		}
	}
}

// Bad cases of a pipeline on a shared store, each a clear error or a clean
// recovery: refused credentials, a missing bucket and an unreachable
// endpoint stop the run before anything runs (exit 2, nothing recorded);
// a shared record whose blob is gone is made again, which stores the blob
// again; a blob whose bytes the server changed is caught before anything
// reads it (exit 3, naming the blob) and nothing of it is recorded here.
func TestPipelineSharedBadCases(t *testing.T) {
	srv := s3test.Start(t, "ferry-bad")
	srv.Env(t)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	const url = "s3://ferry-bad/team"
	root := t.TempDir()

	for _, tc := range []struct {
		name, store string
		env         []string
		want        string
	}{
		{"credentials", url, []string{"AWS_SECRET_ACCESS_KEY=wrong"}, "credentials"},
		{"bucket", "s3://ferry-nope/team", nil, "ferry-nope"},
		{"endpoint", url, []string{"AWS_ENDPOINT_URL_S3=http://127.0.0.1:1"}, "127.0.0.1:1"},
	} {
		m := newSharedMachine(t, root, "bad-"+tc.name, tc.store)
		r := execFerry(t, tc.env, "pipeline", "run", "--cache", m.cache, m.file)
		t.Logf("%s: %s", tc.name, r.stderr)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%s: exit %d, want 2 and %q in:\n%s", tc.name, r.code, tc.want, r.stderr)
		}
		if _, err := os.Stat(filepath.Join(m.cache, "manifest.json")); err == nil {
			t.Errorf("%s: records written in the cache", tc.name)
		}
	}

	a := newSharedMachine(t, root, "machine-a", url)
	if r := execFerry(t, nil, "pipeline", "run", "--cache", a.cache, "--machine", a.name, a.file); r.code != 0 {
		t.Fatalf("machine-a: exit %d\n%s", r.code, r.stderr)
	}
	// The blob of the Q4_K_M GGUF, by its digest in machine-a's view.
	link, err := os.Readlink(filepath.Join(a.dir, "out", "quants", "Merged-3.7M-Q4_K_M.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	hex := filepath.Base(link)
	obj := srv.ObjectPath("ferry-bad", "team/blobs/sha256/"+hex)
	good, err := os.ReadFile(obj)
	if err != nil {
		t.Fatalf("the blob in the bucket: %v", err)
	}

	// Gone: machine-b makes the quants again and stores the blob again.
	if err := os.Remove(obj); err != nil {
		t.Fatal(err)
	}
	b := newSharedMachine(t, root, "machine-b", url)
	cmd, ch, errb := b.startRun(t)
	evs, code := collect(t, b, cmd, ch, errb)
	if code != 0 {
		t.Fatalf("machine-b: exit %d", code)
	}
	if n := len(byStage(evs, pipeline.EventRun)["quants"]); n != 1 {
		t.Errorf("machine-b ran quants %d times, want 1 (its blob was gone)", n)
	}
	if got, err := os.ReadFile(obj); err != nil || !bytes.Equal(got, good) {
		t.Errorf("the blob is not back: %v", err)
	}
	if r := execFerry(t, nil, "store", "verify", url); r.code != 0 {
		t.Fatalf("store verify: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// Changed on the server: caught. A machine without the base files
	// that makes checked again (--only checked --force checked), which
	// reads quants, cannot make quants: exit 3, naming the
	// stage and the blob and how to repair, nothing of it recorded there,
	// the blob left.
	bad := append([]byte(nil), good...)
	bad[len(bad)/2] ^= 0xff
	if err := os.WriteFile(obj, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := execFerry(t, nil, "store", "verify", url); r.code != 3 {
		t.Errorf("store verify of the damaged bucket: exit %d, want 3", r.code)
	}
	d := newSharedMachine(t, root, "machine-d", url)
	if err := os.RemoveAll(filepath.Join(d.dir, "models")); err != nil { // a Mac that only serves
		t.Fatal(err)
	}
	r := execFerry(t, nil, "pipeline", "run", "--cache", d.cache, "--only", "checked", "--force", "checked", d.file)
	t.Logf("damaged, --only checked --force checked: %s", r.stderr)
	if r.code != 3 || !strings.Contains(r.stderr, "input quants") || !strings.Contains(r.stderr, hex[:12]) || !strings.Contains(r.stderr, "verify --repair") {
		t.Errorf("damaged blob of an input: exit %d, want 3 naming the stage, the blob and the repair:\n%s", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(d.dir, "out", "quants")); err == nil {
		t.Errorf("a view of the damaged stage was made")
	}
	if got, err := os.ReadFile(obj); err != nil || !bytes.Equal(got, bad) {
		t.Errorf("the damaged blob was changed by a machine that cannot make its stage: %v", err)
	}
	// A machine that can make it reads it twice, the same wrong bytes:
	// removes it, makes quants again and stores it again, with a warning.
	c := newSharedMachine(t, root, "machine-c", url)
	cmd, ch, errb = c.startRun(t)
	evs, code = collect(t, c, cmd, ch, errb)
	if code != 0 {
		t.Fatalf("machine-c on the damaged blob: exit %d\n%s", code, errb)
	}
	if n := len(byStage(evs, pipeline.EventRun)["quants"]); n != 1 {
		t.Errorf("machine-c ran quants %d times, want 1 (its blob was damaged)", n)
	}
	warned := false
	for _, e := range evs {
		warned = warned || e.Event == pipeline.EventWarning && e.Stage == "quants" && strings.Contains(e.Reason, "damaged in the shared store") && strings.Contains(e.Reason, hex[:12])
	}
	if !warned {
		t.Errorf("no warning event of the damaged blob removed: %+v", evs)
	}
	if got, err := os.ReadFile(obj); err != nil || !bytes.Equal(got, good) {
		t.Errorf("the blob is not whole again: %v", err)
	}
	if r := execFerry(t, nil, "store", "verify", url); r.code != 0 {
		t.Errorf("store verify after machine-c: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// A bounded cache (--cache-max): after a run, results no stage points at
// any more that the bucket holds leave the cache with their blobs; the
// views stay; a later run that wants such a result fetches it again.
func TestPipelineSharedCacheBound(t *testing.T) {
	srv := s3test.Start(t, "ferry-bound")
	srv.Env(t)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	m := newSharedMachine(t, t.TempDir(), "mac", "s3://ferry-bound/team")
	setType := func(typ string) {
		t.Helper()
		body, err := os.ReadFile(m.file)
		if err != nil {
			t.Fatal(err)
		}
		s := strings.NewReplacer("type: Q4_K_M", "type: "+typ, "type: Q6_K", "type: "+typ).Replace(string(body))
		if err := os.WriteFile(m.file, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(typ string) []pipeline.Event {
		t.Helper()
		setType(typ)
		cmd, ch, errb := m.startRun(t, "--cache-max", "1KB")
		evs, code := collect(t, m, cmd, ch, errb)
		if code != 0 {
			t.Fatalf("%s: exit %d", typ, code)
		}
		return evs
	}
	blob := func() string {
		t.Helper()
		link, err := os.Readlink(filepath.Join(m.dir, "out", "quants", "Merged-3.7M-"+"Q4_K_M.gguf"))
		if err != nil {
			t.Fatal(err)
		}
		return filepath.Join(m.cache, "blobs", "sha256", filepath.Base(link))
	}
	run("Q4_K_M")
	q4 := blob()
	if _, err := os.Stat(q4); err != nil {
		t.Fatalf("the Q4_K_M blob is not in the cache after its run: %v", err)
	}
	evs := run("Q6_K")
	if n := len(byStage(evs, pipeline.EventRun)["quants"]); n != 1 {
		t.Fatalf("Q6_K: quants ran %d times", n)
	}
	if _, err := os.Stat(q4); err == nil {
		t.Errorf("the Q4_K_M blob, which no stage points at and the bucket holds, is still in the cache")
	}
	if _, err := os.Stat(filepath.Join(m.dir, "out", "quants", "Merged-3.7M-Q6_K.gguf")); err != nil {
		t.Errorf("the Q6_K view: %v", err)
	}
	evs = run("Q4_K_M")
	if es := byStage(evs, pipeline.EventSkip)["quants"]; len(es) != 1 || !strings.HasPrefix(es[0].Reason, "made on mac") {
		t.Errorf("back to Q4_K_M: quants %v, want fetched again from the bucket", es)
	}
	if _, err := os.Stat(q4); err != nil {
		t.Errorf("the Q4_K_M blob was not fetched back: %v", err)
	}
	if r := execFerry(t, nil, "store", "verify", m.cache); r.code != 0 {
		t.Errorf("store verify of the cache: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
