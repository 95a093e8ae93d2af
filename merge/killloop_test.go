package merge

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

const killLoopEnv = "FERRY_MERGE_KILL_LOOP_HELPER"

// writeKillLoopBase writes a base of shards shards, each with layers
// layers of a DoRA-targeted q_proj and an untargeted up_proj (both
// rows×cols), and the adapter: every shard is rewritten and holds
// several tensors, so resuming inside a file matters.
func writeKillLoopBase(t testing.TB, dir string, shards, layers, rows, cols int) (string, string) {
	return writeDoRABase(t, dir, shards, layers, rows, cols, func(l int, p string) genTensor {
		return gen(uint64(10*l+2), p+"mlp.up_proj.weight", tensor.BF16, 0.2, int64(rows), int64(cols))
	})
}

// TestKillLoopHelper is the child of TestKillEvery300ms: a plain merge.
// Run on its own it does nothing.
func TestKillLoopHelper(t *testing.T) {
	if os.Getenv(killLoopEnv) == "" {
		return
	}
	p, err := Inventory(os.Getenv("BASE"), os.Getenv("ADAPTER"), PlanOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	if _, err := Execute(t.Context(), p, os.Getenv("OUT"), ExecOptions{Jobs: 2}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// durableBytes is what the journal at path holds as durable: the finished
// shards' sizes plus the last checkpoint of each unfinished one.
func durableBytes(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	done, ckpt := map[string]int64{}, map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		var e struct {
			Unit, Commit string
			End, Size    int64
		}
		if json.Unmarshal([]byte(line), &e) != nil {
			break // torn last line
		}
		switch {
		case e.Unit == "":
		case e.Commit != "":
			done[e.Unit] = e.Size
			delete(ckpt, e.Unit)
		default:
			ckpt[e.Unit] = e.End
		}
	}
	var n int64
	for _, v := range done {
		n += v
	}
	for _, v := range ckpt {
		n += v
	}
	return n
}

// TestKillEvery300ms: a merge SIGKILLed every 300 ms, started again each
// time, keeps its progress inside files (position and sha256 state at
// write boundaries), so what is durable never goes back, it finishes, and
// it ends with the bytes of an uninterrupted merge and no journal. The
// input is sized so that an uninterrupted merge takes longer than 300 ms
// here (checked): a merge that restarted its file from byte 0 could not
// finish.
func TestKillEvery300ms(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a merge every 300 ms for several seconds")
	}
	dir := t.TempDir()
	base, ad := writeKillLoopBase(t, dir, 2, 16, 1024, 2048)
	start := time.Now()
	_, want := runMerge(t, base, ad, filepath.Join(dir, "ref"), PlanOptions{}, 2)
	took := time.Since(start)
	t.Logf("uninterrupted merge: %v", took)
	const every = 300 * time.Millisecond
	if took < every {
		t.Fatalf("an uninterrupted merge took %v: too small an input to show resume inside a file (want over %v)", took, every)
	}

	out := filepath.Join(dir, "out")
	jp := filepath.Join(out, JournalName)
	// It must keep moving: a run of kills with nothing more durable is a
	// failure, however long the machine takes to start each child (a busy
	// 2-core machine can spend most of a 300 ms window starting one, and a
	// fixed deadline then failed a merge that was resuming fine). The
	// overall cap only stops a test that hangs.
	const stallKills = 40
	deadline := time.Now().Add(5 * time.Minute)
	kills, stalled := 0, 0
	var durable int64
	for {
		if time.Now().After(deadline) {
			t.Fatalf("not finished after %d kills (%d bytes durable)", kills, durable)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestKillLoopHelper$", "-test.count=1")
		cmd.Env = append(os.Environ(), killLoopEnv+"=1", "BASE="+base, "ADAPTER="+ad, "OUT="+out)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("after %d kills the merge failed: %v: %s", kills, err, stderr.String())
			}
		case <-time.After(every):
			cmd.Process.Signal(syscall.SIGKILL)
			<-exited
			kills++
			if _, err := os.Stat(jp); os.IsNotExist(err) && fileExists(filepath.Join(out, safetensors.IndexName)) {
				break // killed after the merge finished (the journal goes last)
			}
			d := durableBytes(jp)
			if d < durable {
				t.Fatalf("kill %d: %d bytes durable, fewer than the %d before", kills, d, durable)
			}
			if stalled++; d > durable {
				stalled = 0
			}
			if stalled == stallKills {
				t.Fatalf("%d kills in a row made nothing more durable (%d bytes after %d kills)", stallKills, d, kills)
			}
			durable = d
			continue
		}
		break
	}
	t.Logf("finished after %d kills every %v", kills, every)
	if kills < 2 {
		t.Errorf("only %d kills landed: the test does not exercise resume", kills)
	}
	got := runMergeResult(t, base, ad, out)
	if len(got.Files) != len(want.Files) {
		t.Fatalf("%d files, want %d", len(got.Files), len(want.Files))
	}
	for i := range want.Files {
		if got.Files[i] != want.Files[i] {
			t.Errorf("%s: %s after %d kills, %s uninterrupted", want.Files[i].Name, got.Files[i].SHA256, kills, want.Files[i].SHA256)
		}
	}
	assertOnlyArtifact(t, out)
}

// runMergeResult hashes the files of a finished output directory in the
// order of an uninterrupted merge's Result.
func runMergeResult(t *testing.T, base, ad, out string) *Result {
	t.Helper()
	p, err := Inventory(base, ad, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	res := &Result{OutDir: out}
	names := append([]string(nil), p.AuxFiles...)
	for _, s := range p.Shards {
		names = append(names, s.Name)
	}
	if !p.Single {
		names = append(names, "model.safetensors.index.json")
	}
	for _, n := range names {
		d, err := digestFile(t.Context(), filepath.Join(out, n))
		if err != nil {
			t.Fatal(err)
		}
		res.Files = append(res.Files, d)
	}
	return res
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
