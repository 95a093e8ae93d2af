package merge

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

const killHelperEnv = "FERRY_MERGE_KILL_HELPER"

// writeMultiShard writes a base of n shards, each with one targeted
// q_proj (rows×cols) and one untargeted tensor, and a DoRA adapter for it.
func writeMultiShard(t testing.TB, dir string, n, rows, cols int) (string, string) {
	base, ad := filepath.Join(dir, "base"), filepath.Join(dir, "adapter")
	groups := make([][]genTensor, n)
	var ats []genTensor
	for l := 0; l < n; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		groups[l] = []genTensor{
			gen(uint64(10*l+1), p+"self_attn.q_proj.weight", tensor.BF16, 0.2, int64(rows), int64(cols)),
			gen(uint64(10*l+2), p+"input_layernorm.weight", tensor.BF16, 1, int64(cols)),
		}
		k := prefix + p + "self_attn.q_proj"
		ats = append(ats,
			gen(uint64(10*l+3), k+".lora_A.weight", tensor.F32, 0.5, 8, int64(cols)),
			gen(uint64(10*l+4), k+".lora_B.weight", tensor.F32, 0.1, int64(rows), 8),
			gen(uint64(10*l+5), k+".lora_magnitude_vector", tensor.F32, 1, int64(rows)))
	}
	writeBase(t, base, groups)
	writeAdapter(t, ad, map[string]any{"target_modules": []string{"q_proj"}, "use_dora": true, "r": 8, "lora_alpha": 16}, ats)
	return base, ad
}

// TestKillHelper is the child process of TestKillResume: it merges slowly
// until it is killed. Run on its own it does nothing.
func TestKillHelper(t *testing.T) {
	if os.Getenv(killHelperEnv) == "" {
		return
	}
	base, ad, out := os.Getenv("BASE"), os.Getenv("ADAPTER"), os.Getenv("OUT")
	p, err := Inventory(base, ad, PlanOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	// Slow enough to be killed mid-merge: a pause on every progress step.
	_, err = Execute(t.Context(), p, out, ExecOptions{Jobs: 2, BlockElems: 1 << 14, Progress: func(int64, int64) { time.Sleep(2 * time.Millisecond) }})
	fmt.Fprintln(os.Stderr, "helper finished:", err)
	os.Exit(4) // it should have been killed before this
}

// TestKillResume: SIGKILL during a multi-shard merge leaves no complete-
// looking checkpoint; the re-run keeps the shards the journal verified and
// ends with the same bytes as an uninterrupted merge.
func TestKillResume(t *testing.T) {
	dir := t.TempDir()
	base, ad := writeMultiShard(t, dir, 6, 256, 512)

	// Reference: uninterrupted.
	_, want := runMerge(t, base, ad, filepath.Join(dir, "ref"), PlanOptions{}, 2)

	out := filepath.Join(dir, "out")
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), killHelperEnv+"=1", "BASE="+base, "ADAPTER="+ad, "OUT="+out)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Kill once the journal has recorded two shards (and before the end).
	deadline := time.Now().Add(30 * time.Second)
	recorded := 0
	for time.Now().Before(deadline) {
		recorded = journalCount(filepath.Join(out, JournalName))
		if recorded >= 2 {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("helper was not killed mid-merge (%v, %d shards recorded): the merge finished first", err, recorded)
	}
	recorded = journalCount(filepath.Join(out, JournalName))
	t.Logf("killed after %d of 6 shards were recorded", recorded)
	if recorded < 2 || recorded >= 6 {
		t.Fatalf("%d shards recorded at the kill; want a kill mid-merge", recorded)
	}
	if c, err := safetensors.OpenDir(out); err == nil {
		c.Close()
		t.Fatal("the killed output directory opens as a complete checkpoint")
	}

	// Re-run: finished shards are verified and kept.
	p, err := Inventory(base, ad, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	res, err := Execute(t.Context(), p, out, ExecOptions{Jobs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Resumed) < 2 {
		t.Errorf("re-run resumed %v, want the %d recorded shards", res.Resumed, recorded)
	}
	if len(res.Files) != len(want.Files) {
		t.Fatalf("%d files, want %d", len(res.Files), len(want.Files))
	}
	for i := range want.Files {
		if res.Files[i] != want.Files[i] {
			t.Errorf("%s: %s after resume, %s uninterrupted", want.Files[i].Name, res.Files[i].SHA256, want.Files[i].SHA256)
		}
	}
	if _, err := safetensors.OpenDir(out); err != nil {
		t.Errorf("resumed output does not open: %v", err)
	}
	if stale, _ := filepath.Glob(filepath.Join(out, ".*.partial")); len(stale) > 0 {
		t.Errorf("temp files left after the resumed run: %v", stale)
	}

	// A tampered finished shard is not trusted: it is rewritten.
	victim := filepath.Join(out, res.Resumed[0])
	b, _ := os.ReadFile(victim)
	b[len(b)-1] ^= 0xff
	os.WriteFile(victim, b, 0o644)
	res2, err := Execute(t.Context(), p, out, ExecOptions{Jobs: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(res2.Written) != 1 || res2.Written[0] != res.Resumed[0] {
		t.Errorf("after tampering: wrote %v, want only %s", res2.Written, res.Resumed[0])
	}
	for i := range want.Files {
		if res2.Files[i] != want.Files[i] {
			t.Errorf("%s differs after repairing", want.Files[i].Name)
		}
	}
}

func journalCount(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	var j journal
	if json.Unmarshal(b, &j) != nil {
		return 0
	}
	return len(j.Files)
}
