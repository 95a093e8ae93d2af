package merge

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
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
	return writeDoRABase(t, dir, n, 1, rows, cols, func(l int, p string) genTensor {
		return gen(uint64(10*l+2), p+"input_layernorm.weight", tensor.BF16, 1, int64(cols))
	})
}

// writeDoRABase writes a base of shards shards of layers layers each: a
// DoRA-targeted q_proj (rows×cols) and the untargeted tensor other makes,
// and the adapter.
func writeDoRABase(t testing.TB, dir string, shards, layers, rows, cols int, other func(l int, prefix string) genTensor) (string, string) {
	base, ad := filepath.Join(dir, "base"), filepath.Join(dir, "adapter")
	groups := make([][]genTensor, shards)
	var ats []genTensor
	for s := range shards {
		for l := s * layers; l < (s+1)*layers; l++ {
			p := fmt.Sprintf("model.layers.%d.", l)
			groups[s] = append(groups[s], gen(uint64(10*l+1), p+"self_attn.q_proj.weight", tensor.BF16, 0.2, int64(rows), int64(cols)), other(l, p))
			k := prefix + p + "self_attn.q_proj"
			ats = append(ats,
				gen(uint64(10*l+3), k+".lora_A.weight", tensor.F32, 0.5, 8, int64(cols)),
				gen(uint64(10*l+4), k+".lora_B.weight", tensor.F32, 0.1, int64(rows), 8),
				gen(uint64(10*l+5), k+".lora_magnitude_vector", tensor.F32, 1, int64(rows)))
		}
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
	// Three shards at once: the kill can fall inside several.
	_, err = Execute(t.Context(), p, out, ExecOptions{Jobs: 2, Shards: 3, BlockElems: 1 << 14, Progress: func(int64, int64) { time.Sleep(2 * time.Millisecond) }})
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

	// A finished shard changed behind the journal's back (its stamp moved)
	// is re-hashed, not trusted: it is rewritten.
	// Shards are written at once: the kill can fall between a shard's
	// journaled commit and its rename, which leaves it under its partial
	// name (the re-run finishes the rename when the stamp still matches).
	done := journalDone(filepath.Join(out, JournalName))
	victim := filepath.Join(out, done[0])
	if _, err := os.Stat(victim); err != nil {
		victim = partialPath(out, done[0])
	}
	b, err := os.ReadFile(victim)
	if err != nil || len(b) == 0 {
		t.Fatalf("recorded shard %s: neither it nor its partial file: %v", done[0], err)
	}
	b[len(b)-1] ^= 0xff
	os.WriteFile(victim, b, 0o644)

	// Re-run: the other finished shards are kept, the rest written.
	p, err := Inventory(base, ad, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	res, err := Execute(t.Context(), p, out, ExecOptions{Jobs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Resumed) != len(done)-1 || slices.Contains(res.Resumed, done[0]) || !slices.Contains(res.Written, done[0]) {
		t.Errorf("re-run resumed %v and wrote %v; want the %d recorded shards %v kept but the tampered %s", res.Resumed, res.Written, len(done), done, done[0])
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
	assertOnlyArtifact(t, out)
}

// assertOnlyArtifact fails if a finished output directory holds anything
// but the checkpoint's own files (a journal, a temp file).
func assertOnlyArtifact(t *testing.T, dir string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("finished output %s holds %s", dir, e.Name())
		}
	}
}

// journalCount is the number of shards the journal at path records as
// finished.
func journalCount(path string) int { return len(journalDone(path)) }

// journalDone lists the shards the journal at path records as finished.
func journalDone(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	done := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		var e struct{ Unit, Commit string }
		if json.Unmarshal([]byte(line), &e) != nil {
			break // torn last line
		}
		if e.Commit != "" {
			done[e.Unit] = true
		}
	}
	return slices.Sorted(maps.Keys(done))
}
