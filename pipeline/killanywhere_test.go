package pipeline_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/sshdtest"
	"github.com/ferry-llm/ferry/pipeline"
)

// jarvis2Run is pipelines/jarvis2.yaml set up as make demo-full runs it:
// the bundled tiny example, two real sshd servers on 127.0.0.1 reached
// through a HOME of its own (~/.ssh/config with two Host aliases).
type jarvis2Run struct {
	t      *testing.T
	file   string   // the copy of jarvis2.yaml
	remote string   // root of both destinations
	env    []string // HOME, no agent
	vars   []string // --var arguments
}

func newJarvis2Run(t *testing.T, home, remote string) *jarvis2Run {
	t.Helper()
	src, err := os.ReadFile("../pipelines/jarvis2.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "jarvis2.yaml")
	write(t, file, string(src))
	models, err := filepath.Abs("../testdata/models/qwen35-tiny")
	if err != nil {
		t.Fatal(err)
	}
	imatrix, err := filepath.Abs("../gguf/imatrix/testdata/qwen35-imatrix.gguf")
	if err != nil {
		t.Fatal(err)
	}
	return &jarvis2Run{t: t, file: file, remote: remote,
		env: []string{"HOME=" + home, "SSH_AUTH_SOCK=", "FERRY_PROGRESS_INTERVAL=10ms"},
		vars: []string{
			"--var", "BASE=" + models + "/base",
			"--var", "ADAPTER=" + models + "/adapter-dora",
			"--var", "NAME=Jarvis2-tiny",
			"--var", "IMATRIX=" + imatrix,
			"--var", "TARGETS=kill-a:" + remote + "/a/jarvis2,kill-b:" + remote + "/b/jarvis2",
		}}
}

func (j *jarvis2Run) args(cmd ...string) []string {
	return append(append(append([]string{}, cmd...), j.vars...), j.file)
}

// remoteFiles is every file under both destinations, by path, with its sha256.
func (j *jarvis2Run) remoteFiles() map[string]string {
	j.t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(j.remote, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(j.remote, p)
		sum := sha256.Sum256(b)
		out[rel] = hex.EncodeToString(sum[:])
		return nil
	})
	if err != nil {
		j.t.Fatal(err)
	}
	return out
}

// outputs is every stage's recorded outputs, "stage/path" → digest.
func (j *jarvis2Run) outputs() map[string]string {
	j.t.Helper()
	r := ferryEnv(j.t, j.env, j.args("pipeline", "status", "--json")...)
	var st pipeline.StatusReport
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil {
		j.t.Fatalf("status: %d %s %s", r.code, r.stdout, r.stderr)
	}
	out := map[string]string{}
	for _, s := range st.Stages {
		if s.State != pipeline.StateComplete {
			j.t.Errorf("stage %s: %s %s", s.Stage, s.State, s.Detail)
		}
		for _, o := range s.Outputs {
			out[s.Stage+"/"+o.Path] = o.Digest.String()
		}
	}
	return out
}

// attempt runs the pipeline with --events; onEvent, if not nil, sees each
// event as it comes, with kill, which SIGKILLs the run (from any
// goroutine, at most once). It returns the events and whether kill was
// called before the run ended.
func (j *jarvis2Run) attempt(onEvent func(e pipeline.Event, kill func())) ([]pipeline.Event, bool, error) {
	cmd := exec.Command(ferryBinary(j.t), j.args("pipeline", "run", "--events")...)
	cmd.Env = append(os.Environ(), j.env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		j.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		j.t.Fatal(err)
	}
	var evs []pipeline.Event
	var once sync.Once
	var killed atomic.Bool
	exited := make(chan struct{})
	kill := func() {
		once.Do(func() {
			select {
			case <-exited:
			default:
				killed.Store(true)
				cmd.Process.Signal(syscall.SIGKILL)
			}
		})
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		var e pipeline.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			j.t.Fatalf("event %q: %v", sc.Text(), err)
		}
		evs = append(evs, e)
		if onEvent != nil {
			onEvent(e, kill)
		}
	}
	io.Copy(io.Discard, out)
	once.Do(func() {}) // no kill from now on: the process may be gone
	close(exited)
	werr := cmd.Wait()
	if killed.Load() {
		return evs, true, nil
	}
	if werr != nil {
		return evs, false, fmt.Errorf("run: %v\n%s", werr, stderr.String())
	}
	return evs, false, nil
}

// The whole jarvis2 flow, killed with SIGKILL at random points in every
// stage (the transfer included, twice) and run again each time, ends with
// every artifact, in the store and on both hosts, byte-identical to an
// uninterrupted run's, and no stage that had finished runs again.
func TestKillAnywhere(t *testing.T) {
	if os.Getenv("FERRY_KILL_ANYWHERE") == "" {
		t.Skip("FERRY_KILL_ANYWHERE not set: the whole jarvis2 flow a dozen times, run by make demo-full")
	}
	a := sshdtest.Start(t, sshdtest.Alias("kill-a"))
	b := sshdtest.Start(t, sshdtest.Alias("kill-b"))
	home := t.TempDir()
	write(t, filepath.Join(home, ".ssh/config"), a.HostBlock("kill-a")+b.HostBlock("kill-b"))

	// The reference: one uninterrupted run, with each stage's duration. Its
	// destinations are then moved aside: the destinations are part of the
	// transfer's parameters (and of its record), so both runs use the same.
	remote := filepath.Join(t.TempDir(), "remote")
	ref := newJarvis2Run(t, home, remote)
	evs, _, err := ref.attempt(nil)
	if err != nil {
		t.Fatal(err)
	}
	began := map[string]time.Time{}
	took := map[string]time.Duration{}
	lines := map[string]int{} // progress events per stage
	var stages []string
	for _, e := range evs {
		switch e.Event {
		case pipeline.EventRun:
			began[e.Stage] = e.Time
		case pipeline.EventProgress:
			lines[e.Stage]++
		case pipeline.EventDone:
			took[e.Stage] = e.Time.Sub(began[e.Stage])
			stages = append(stages, e.Stage)
		}
	}
	if len(stages) < 8 { // every stage of jarvis2.yaml
		t.Fatalf("the reference run made %d stages: %v", len(stages), stages)
	}
	wantOut, wantRemote := ref.outputs(), ref.remoteFiles()
	if len(wantRemote) == 0 {
		t.Fatal("the reference run sent nothing")
	}
	if err := os.Rename(remote, remote+".ref"); err != nil {
		t.Fatal(err)
	}

	// Kill points: every stage is a target once, the merge, the conversions
	// and the quantization twice, the transfer four times, in pipeline order
	// (each attempt resumes what the last one killed). An attempt is killed
	// inside its target at a random point: a random time within the stage's
	// reference duration after it starts, or its k-th progress report (k
	// random up to its reference count), whichever comes first, and at the
	// latest when the stage reports done (then between stages). A target
	// that an earlier attempt finished is passed over.
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("FERRY_KILL_SEED"); v != "" {
		fmt.Sscan(v, &seed)
	}
	t.Logf("seed %d (FERRY_KILL_SEED)", seed)
	rng := rand.New(rand.NewPCG(seed, 19))
	targets := append([]string{}, stages...)
	for _, s := range stages {
		switch s {
		case "merged", "f16", "quants", "mlx4":
			targets = append(targets, s)
		case "shipped":
			targets = append(targets, s, s, s)
		}
	}
	sort.SliceStable(targets, func(i, j int) bool { return indexOf(stages, targets[i]) < indexOf(stages, targets[j]) })
	run := newJarvis2Run(t, home, remote)
	done := map[string]bool{} // stages some attempt finished
	kills := 0
	var where []string
	for _, target := range targets {
		if done[target] {
			continue
		}
		delay := time.Duration(rng.Int64N(int64(max(took[target], time.Millisecond))))
		k := 1 + rng.IntN(max(lines[target], 1))
		var timer *time.Timer
		seen := 0
		evs, killed, err := run.attempt(func(e pipeline.Event, kill func()) {
			if e.Stage != target {
				return
			}
			switch e.Event {
			case pipeline.EventRun:
				timer = time.AfterFunc(delay, kill)
			case pipeline.EventProgress:
				if seen++; seen == k {
					kill()
				}
			case pipeline.EventDone:
				kill()
			}
		})
		if timer != nil {
			timer.Stop()
		}
		if err != nil {
			t.Fatalf("attempt %d (kill in %s): %v", kills+1, target, err)
		}
		running := map[string]bool{}
		for _, e := range evs {
			switch e.Event {
			case pipeline.EventRun:
				if done[e.Stage] {
					t.Errorf("attempt %d: stage %s ran again after it had finished: %s", kills+1, e.Stage, e.Reason)
				}
				running[e.Stage] = true
			case pipeline.EventDone:
				done[e.Stage] = true
				delete(running, e.Stage)
			}
		}
		if killed {
			kills++
			var r []string
			for s := range running {
				r = append(r, s)
			}
			sort.Strings(r)
			where = append(where, fmt.Sprintf("%s(%s)", target, strings.Join(r, "+")))
		}
	}
	t.Logf("%d kills, target(stages running when killed): %s", kills, strings.Join(where, " "))
	if kills < 10 {
		t.Errorf("only %d kills landed", kills)
	}
	evs, killed, err := run.attempt(nil)
	if err != nil || killed {
		t.Fatalf("last run: %v", err)
	}
	for _, e := range evs {
		if e.Event == pipeline.EventRun && done[e.Stage] {
			t.Errorf("last run: stage %s ran again after it had finished: %s", e.Stage, e.Reason)
		}
	}
	gotOut, gotRemote := run.outputs(), run.remoteFiles()
	for k, v := range wantOut {
		if gotOut[k] != v {
			t.Errorf("output %s: %s, want %s", k, gotOut[k], v)
		}
	}
	if len(gotOut) != len(wantOut) {
		t.Errorf("%d outputs, want %d", len(gotOut), len(wantOut))
	}
	for k, v := range wantRemote {
		if gotRemote[k] != v {
			t.Errorf("remote %s: %s, want %s", k, gotRemote[k], v)
		}
	}
	if len(gotRemote) != len(wantRemote) {
		t.Errorf("%d remote files, want %d: %v", len(gotRemote), len(wantRemote), gotRemote)
	}
}

func indexOf(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return len(list)
}
