package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/lockfile"
	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/merge"
)

// ferryProc is a ferry child process started without waiting for it.
type ferryProc struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	done           chan struct{}
	code           int
}

func startFerry(t *testing.T, args ...string) *ferryProc {
	t.Helper()
	return start(t, exec.Command(os.Args[0], args...), false)
}

// startGated starts ferry held at a gate: a shell that stops itself and,
// once continued (SIGCONT), execs ferry under the same pid. Processes let
// through the gate together start their work at the same moment.
func startGated(t *testing.T, args ...string) *ferryProc {
	t.Helper()
	return start(t, exec.Command("/bin/sh", append([]string{"-c", `kill -STOP $$; exec "$0" "$@"`, os.Args[0]}, args...)...), true)
}

func start(t *testing.T, cmd *exec.Cmd, gated bool) *ferryProc {
	t.Helper()
	p := &ferryProc{cmd: cmd, done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), "FERRY_INSPECT_TEST_AS_MAIN=1")
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if gated {
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(p.cmd.Process.Pid, &ws, syscall.WUNTRACED, nil); err != nil || !ws.Stopped() {
			t.Fatalf("the gate did not stop: %v, status %v", err, ws)
		}
	}
	go func() {
		err := p.cmd.Wait()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			p.code = ee.ExitCode()
			if p.code < 0 {
				p.code = 128 + int(ee.Sys().(syscall.WaitStatus).Signal())
			}
		} else if err != nil {
			p.code = -1
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGCONT)
		p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// wait waits for the process (at most a minute) and returns its exit code.
func (p *ferryProc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(time.Minute):
		t.Fatalf("ferry %v still running after a minute", p.cmd.Args[1:])
		return 0
	}
}

func (p *ferryProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitLockHolder polls lock until one of procs holds it and returns that
// one's index, or -1 once all of them have exited without being seen
// holding it.
func waitLockHolder(t *testing.T, lock string, procs ...*ferryProc) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if h, err := lockfile.Read(lock); err == nil && h != nil {
			for i, p := range procs {
				if h.PID == p.cmd.Process.Pid {
					return i
				}
			}
		}
		all := true
		for _, p := range procs {
			all = all && p.exited()
		}
		if all {
			return -1
		}
		time.Sleep(100 * time.Microsecond)
	}
	t.Fatalf("no process took %s within a minute", lock)
	return -1
}

// raceOutput starts two ferry processes at the same moment on one output,
// whose lock file is lock, and returns them once both have exited. The one
// seen holding the lock is stopped (SIGSTOP) until the other has finished,
// so the two meet at the lock even if one of them is scheduled late; it
// also checks that the loser left the holder's lock alone.
//
// On a loaded machine one process can take, use and release the lock
// before the poll sees the other take it; the two then ran one after the
// other and both rightly succeed. So a try counts as a race only when one
// of them was refused (checkRace then checks the refusal); when both
// succeed, checkSequential checks that the output is one writer's alone.
func raceOutput(t *testing.T, lock string, a, b []string) (pa, pb *ferryProc) {
	t.Helper()
	pa, pb = startGated(t, a...), startGated(t, b...)
	pa.cmd.Process.Signal(syscall.SIGCONT)
	pb.cmd.Process.Signal(syscall.SIGCONT)
	procs := []*ferryProc{pa, pb}
	if i := waitLockHolder(t, lock, pa, pb); i >= 0 {
		holder, other := procs[i], procs[1-i]
		holder.cmd.Process.Signal(syscall.SIGSTOP)
		h, err := lockfile.Read(lock)
		held := err == nil && h != nil && h.PID == holder.cmd.Process.Pid
		other.wait(t)
		if held && other.code != 0 {
			if h, err := lockfile.Read(lock); err != nil || h == nil || h.PID != holder.cmd.Process.Pid {
				t.Errorf("after the loser: lock %+v, %v; want the holder's (pid %d)", h, err, holder.cmd.Process.Pid)
			}
		}
		holder.cmd.Process.Signal(syscall.SIGCONT)
	}
	pa.wait(t)
	pb.wait(t)
	return pa, pb
}

// raceTries bounds the tries a race test makes to see 40 races in which
// one writer was refused: with a lock that does not exclude, the test
// fails here or on a mixed output.
const raceTries = 120

// checkRace: exactly one of the two won, the loser exited 1 naming the
// winner's pid and host, and it returns the winner's index.
func checkRace(t *testing.T, try int, runs ...*ferryProc) int {
	t.Helper()
	host, _ := os.Hostname()
	winner := -1
	for i, r := range runs {
		if r.code == 0 {
			if winner >= 0 {
				t.Fatalf("try %d: both writers exited 0\n%s\n%s", try, runs[0].stderr.String(), runs[1].stderr.String())
			}
			winner = i
		}
	}
	if winner < 0 {
		t.Fatalf("try %d: no writer won: exit %d: %s\nexit %d: %s", try, runs[0].code, runs[0].stderr.String(), runs[1].code, runs[1].stderr.String())
	}
	loser := runs[1-winner]
	want := fmt.Sprintf("output is locked by pid %d on host %s", runs[winner].cmd.Process.Pid, host)
	if loser.code != exitFailure || !strings.Contains(loser.stderr.String(), want) {
		t.Fatalf("try %d: loser exit %d, stderr %q; want exit 1 saying %q", try, loser.code, loser.stderr.String(), want)
	}
	return winner
}

// checkSequential checks a try in which both writers succeeded, one after
// the other: the output is exactly one writer's — never a mix. The tree is
// dir's, or got when dir is "".
func checkSequential(t *testing.T, try int, dir string, want []map[string]string, a, b *ferryProc, got ...map[string]string) {
	t.Helper()
	tree := map[string]string{}
	if dir != "" {
		tree = treeDigest(t, dir)
	} else if len(got) > 0 {
		tree = got[0]
	}
	for _, w := range want {
		if reflect.DeepEqual(tree, w) {
			return
		}
	}
	t.Fatalf("try %d (both succeeded): the output holds %v, want exactly one writer's", try, tree)
}

// lockRaceModel writes a small Qwen3 checkpoint (3.6 MB in two shards and
// an index) and a LoRA adapter for it: a race costs little more than
// starting its two processes.
func lockRaceModel(t *testing.T) (base, adapter string) {
	t.Helper()
	dir := t.TempDir()
	base, adapter = filepath.Join(dir, "base"), filepath.Join(dir, "adapter")
	m, err := (testmodel.Qwen3Options{Common: testmodel.Common{
		Seed: 3, HiddenSize: 256, IntermediateSize: 512, NumLayers: 2, NumHeads: 4, NumKVHeads: 2, HeadDim: 64,
		VocabSize: 1024, MaxShardSize: 2 << 20,
	}}).Write(base)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (testmodel.AdapterOptions{Seed: 4}).Write(adapter, m); err != nil {
		t.Fatal(err)
	}
	return base, adapter
}

// treeDigest maps every path under root to what it is: a file's sha256, a
// link's target, "dir".
func treeDigest(t *testing.T, root string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			m[rel] = "-> " + target
			return err
		case d.IsDir():
			m[rel] = "dir"
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			s := sha256.Sum256(b)
			m[rel] = hex.EncodeToString(s[:])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Two `ferry gguf convert -o X` at once, with different --outtype: each
// time exactly one writes X, byte-identical to its output alone; the other
// exits 1 naming the winner's pid and host and leaves nothing behind.
func TestGGUFConvertConcurrentWriters(t *testing.T) {
	base, _ := lockRaceModel(t)
	refDir := t.TempDir()
	types := [2]string{"f16", "bf16"}
	var want [2]map[string]string
	for i, ot := range types {
		out := filepath.Join(refDir, ot, "m.gguf")
		os.MkdirAll(filepath.Dir(out), 0o755)
		if r := execFerry(t, nil, "gguf", "convert", "--outtype", ot, "-o", out, base); r.code != 0 {
			t.Fatalf("%s: exit %d: %s", ot, r.code, r.stderr)
		}
		want[i] = treeDigest(t, filepath.Dir(out))
	}
	if reflect.DeepEqual(want[0], want[1]) {
		t.Fatal("the two outtypes give the same file: the race could not tell the writers apart")
	}
	start := time.Now()
	wins := [2]int{}
	races := 0
	for try := 0; races < 40; try++ {
		if try == raceTries {
			t.Fatalf("only %d of %d tries had a writer refused by the other's lock", races, try)
		}
		dir := t.TempDir()
		out := filepath.Join(dir, "m.gguf")
		args := func(ot string) []string {
			return []string{"gguf", "convert", "--jobs", "1", "--outtype", ot, "-o", out, base}
		}
		a, b := raceOutput(t, out+".lock", args(types[try%2]), args(types[1-try%2]))
		if a.code == 0 && b.code == 0 {
			checkSequential(t, try, dir, want[:], a, b)
			continue
		}
		races++
		w := checkRace(t, try, a, b)
		wt := (try%2 + w) % 2 // index into types of the winner's --outtype
		wins[wt]++
		if got := treeDigest(t, dir); !reflect.DeepEqual(got, want[wt]) {
			t.Fatalf("try %d: the output directory holds %v, want only the %s writer's file %v", try, got, types[wt], want[wt])
		}
	}
	t.Logf("40 races with a refused writer in %v; wins by outtype %v: %v", time.Since(start).Round(time.Millisecond), types, wins)
}

// Two `ferry merge --out D` at once (different --dtype): exactly one
// writes D, file for file what it writes alone; the other exits 1 naming
// it and never creates D.
func TestMergeConcurrentWriters(t *testing.T) {
	base, adapter := lockRaceModel(t)
	refDir := t.TempDir()
	dtypes := [2]string{"bf16", "f32"}
	var want [2]map[string]string
	for i, dt := range dtypes {
		out := filepath.Join(refDir, dt)
		if r := execFerry(t, nil, "merge", "--base", base, "--adapter", adapter, "--dtype", dt, "--out", out); r.code != 0 {
			t.Fatalf("%s: exit %d: %s", dt, r.code, r.stderr)
		}
		want[i] = treeDigest(t, out)
		delete(want[i], merge.JournalName) // a merge's journal records when it ran
	}
	if reflect.DeepEqual(want[0], want[1]) {
		t.Fatal("the two dtypes give the same merge: the race could not tell the writers apart")
	}
	start := time.Now()
	races := 0
	for try := 0; races < 40; try++ {
		if try == raceTries {
			t.Fatalf("only %d of %d tries had a writer refused by the other's lock", races, try)
		}
		parent := t.TempDir()
		out := filepath.Join(parent, "merged")
		args := func(dt string) []string {
			return []string{"merge", "--base", base, "--adapter", adapter, "--dtype", dt, "--jobs", "1", "--out", out}
		}
		a, b := raceOutput(t, out+".lock", args(dtypes[try%2]), args(dtypes[1-try%2]))
		if a.code == 0 && b.code == 0 {
			got := treeDigest(t, out)
			delete(got, merge.JournalName)
			checkSequential(t, try, "", want[:], a, b, got)
			continue
		}
		races++
		w := checkRace(t, try, a, b)
		wt := (try%2 + w) % 2
		got := treeDigest(t, out)
		delete(got, merge.JournalName)
		if !reflect.DeepEqual(got, want[wt]) {
			t.Fatalf("try %d: %s holds %v, want the %s merge %v", try, out, got, dtypes[wt], want[wt])
		}
		if ents, _ := os.ReadDir(parent); len(ents) != 1 {
			t.Fatalf("try %d: beside the output: %v, want only it", try, ents)
		}
	}
	t.Logf("40 races with a refused writer in %v", time.Since(start).Round(time.Millisecond))
}

// The output lock's life: --lock-wait waits for the holder and then
// writes; a SIGKILLed holder's lock is taken over; a failed run and a
// refused run leave no lock.
func TestOutputLockLifecycle(t *testing.T) {
	base, _ := lockRaceModel(t)
	ref := filepath.Join(t.TempDir(), "ref.gguf")
	if r := execFerry(t, nil, "gguf", "convert", "--outtype", "bf16", "-o", ref, base); r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	want := treeDigest(t, filepath.Dir(ref))["ref.gguf"]
	convert := func(out string, extra ...string) []string {
		return append([]string{"gguf", "convert", "--jobs", "1", "-o", out, base}, extra...)
	}

	t.Run("lock-wait", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "m.gguf")
		first := startFerry(t, convert(out)...)
		if waitLockHolder(t, out+".lock", first) != 0 {
			t.Fatalf("first run never held the lock: exit %d: %s", first.code, first.stderr.String())
		}
		first.cmd.Process.Signal(syscall.SIGSTOP)
		second := startFerry(t, convert(out, "--outtype", "bf16", "--lock-wait", "1m")...)
		time.Sleep(time.Second) // the second meets the lock and waits
		if second.exited() {
			t.Fatalf("--lock-wait 1m did not wait: exit %d: %s", second.code, second.stderr.String())
		}
		first.cmd.Process.Signal(syscall.SIGCONT)
		if c1, c2 := first.wait(t), second.wait(t); c1 != 0 || c2 != 0 {
			t.Fatalf("exits %d, %d: %s\n%s", c1, c2, first.stderr.String(), second.stderr.String())
		}
		if got := treeDigest(t, filepath.Dir(out)); !reflect.DeepEqual(got, map[string]string{".": "dir", "m.gguf": want}) {
			t.Errorf("after the wait: %v, want only the waiting run's bf16 file", got)
		}
	})

	t.Run("SIGKILLed holder", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "m.gguf")
		killed := startFerry(t, convert(out)...)
		if waitLockHolder(t, out+".lock", killed) != 0 {
			t.Fatalf("never held the lock: exit %d: %s", killed.code, killed.stderr.String())
		}
		killed.cmd.Process.Kill()
		killed.wait(t)
		if _, err := os.Stat(out + ".lock"); err != nil {
			t.Fatalf("a SIGKILLed holder's lock should remain: %v", err)
		}
		r := execFerry(t, nil, convert(out, "--outtype", "bf16")...)
		if r.code != 0 || !strings.Contains(r.stderr, "took over a stale output lock") {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		if got := treeDigest(t, filepath.Dir(out)); !reflect.DeepEqual(got, map[string]string{".": "dir", "m.gguf": want}) {
			t.Errorf("after the takeover: %v", got)
		}
	})

	t.Run("failure after the lock", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "m.gguf")
		// A directory where the partial file goes: the write fails.
		os.Mkdir(out+".partial", 0o755)
		if r := execFerry(t, nil, convert(out)...); r.code == 0 {
			t.Fatal("the conversion succeeded with a directory in the way")
		}
		if _, err := os.Stat(out + ".lock"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a failed run left its lock: %v", err)
		}
	})

	t.Run("locked by another host", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "m.gguf")
		lock := `{"pid":1,"host":"elsewhere.example","started":"2026-01-01T00:00:00Z","command":"ferry gguf convert"}`
		os.WriteFile(out+".lock", []byte(lock), 0o644)
		before := treeDigest(t, filepath.Dir(out))
		r := execFerry(t, nil, convert(out)...)
		if r.code != exitFailure || !strings.Contains(r.stderr, "output is locked by pid 1 on host elsewhere.example") {
			t.Errorf("exit %d: %s", r.code, r.stderr)
		}
		if got := treeDigest(t, filepath.Dir(out)); !reflect.DeepEqual(got, before) {
			t.Errorf("the refused run changed %v to %v", before, got)
		}
	})
}

// No command writes over, inside or (a directory output) around one of
// its inputs, however the paths are spelled: exit 2, the inputs' bytes
// unchanged, nothing created.
func TestOutputOverInput(t *testing.T) {
	root := t.TempDir()
	models := filepath.Join(root, "models")
	ck, adapter, mlxSrc := filepath.Join(models, "ck"), filepath.Join(models, "adapter"), filepath.Join(models, "mlxsrc")
	shard := filepath.Join(ck, "model-00001-of-00007.safetensors")
	alias := filepath.Join(root, "alias") // → models
	shardLink := filepath.Join(root, "shard-link.safetensors")
	build := func() {
		for _, p := range []string{models, alias, shardLink} {
			os.RemoveAll(p)
		}
		copyDir(t, qwen35Base, ck)
		copyDir(t, qwen35DoRA, adapter)
		if err := testmodel.CompressedDeepSeekV3(1).Write(mlxSrc); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("models", alias); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(shard, shardLink); err != nil {
			t.Fatal(err)
		}
	}
	build()
	aliased := func(p string) string { return filepath.Join(alias, strings.TrimPrefix(p, models)) }
	gguf := func(in, out string) []string { return []string{"gguf", "convert", in, "-o", out} }
	mergeTo := func(out string) []string {
		return []string{"merge", "--base", ck, "--adapter", adapter, "--out", out}
	}
	mlx := func(dst string) []string { return []string{"mlx", "repack", "--src", mlxSrc, "--dst", dst} }
	inspect := func(in, out string) []string { return []string{"inspect", in, "--parquet", out} }
	tests := []struct {
		name string
		args []string
	}{
		{"gguf convert over an input shard", gguf(ck, shard)},
		{"gguf convert to a new file inside the input", gguf(ck, filepath.Join(ck, "m.gguf"))},
		{"gguf convert -o the input directory", gguf(ck, ck)},
		{"gguf convert over a shard through a linked directory", gguf(ck, aliased(filepath.Join(ck, "model-00002-of-00007.safetensors")))},
		{"gguf convert over a link to a shard", gguf(ck, shardLink)},
		{"gguf convert of an input named through a link", gguf(aliased(ck), filepath.Join(ck, "m.gguf"))},
		{"merge into the base", mergeTo(ck)},
		{"merge into the adapter through a link", mergeTo(aliased(adapter))},
		{"merge inside the base", mergeTo(filepath.Join(ck, "merged"))},
		{"merge inside the adapter through a link", mergeTo(filepath.Join(aliased(adapter), "merged"))},
		{"merge into a directory holding the inputs", mergeTo(models)},
		{"mlx repack into the source", mlx(mlxSrc)},
		{"mlx repack inside the source through a link", mlx(filepath.Join(aliased(mlxSrc), "mlx"))},
		{"mlx repack into a directory holding the source", mlx(models)},
		{"inspect --parquet over a shard", inspect(ck, shard)},
		{"inspect --parquet inside the input", inspect(ck, filepath.Join(ck, "t.parquet"))},
		{"inspect --parquet over the inspected file", inspect(shard, shard)},
		{"inspect --parquet over a file inspected through a link", inspect(shardLink, shard)},
		{"inspect --parquet inside the input through a link", inspect(ck, filepath.Join(aliased(ck), "t.parquet"))},
	}
	before := treeDigest(t, root)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := execFerry(t, nil, tt.args...)
			if r.code != exitBadInput || !strings.Contains(r.stderr, "output over an input") {
				t.Errorf("exit %d, stderr %q; want exit 2, output over an input", r.code, r.stderr)
			}
			if after := treeDigest(t, root); !reflect.DeepEqual(after, before) {
				for p, d := range after {
					if before[p] != d {
						t.Errorf("%s: %s, was %q", p, d, before[p])
					}
				}
				for p := range before {
					if _, ok := after[p]; !ok {
						t.Errorf("%s: gone", p)
					}
				}
				build() // the next case starts from the original tree
			}
		})
	}
}

// Every --lock-wait says what its value looks like.
func TestLockWaitHelp(t *testing.T) {
	for _, cmd := range [][]string{
		{"pipeline", "run"}, {"gguf", "convert"}, {"quantize"}, {"merge"}, {"mlx", "repack"}, {"inspect"},
	} {
		out, code, err := runFerry(t, append(cmd, "--help")...)
		if code != 0 {
			t.Fatalf("%v --help: exit %d: %v", cmd, code, err)
		}
		var line string
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "--lock-wait") {
				line = l
			}
		}
		if !strings.Contains(line, "--lock-wait DURATION") || !strings.Contains(line, "a Go duration such as 30s, 5m") || !strings.Contains(line, "0 fails at once") {
			t.Errorf("%v --help: --lock-wait line %q does not say its format", cmd, line)
		}
	}
}

// A lock names the command that holds it as the user typed it: a second
// writer of the same output is refused with the holder's pid, host and
// "ferry mlx quantize" (not "ferry quantize", another command).
func TestOutputLockNamesHolder(t *testing.T) {
	base, adapter := lockRaceModel(t)
	tests := []struct {
		holder string
		args   func(out string) []string
		isDir  bool
	}{
		{"ferry mlx quantize", func(out string) []string {
			return []string{"mlx", "quantize", base, "--out", out, "--bits", "4", "--jobs", "1"}
		}, true},
		{"ferry gguf convert", func(out string) []string {
			return []string{"gguf", "convert", base, "-o", out, "--jobs", "1"}
		}, false},
		{"ferry merge", func(out string) []string {
			return []string{"merge", "--base", base, "--adapter", adapter, "--out", out, "--jobs", "1"}
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.holder, func(t *testing.T) {
			// The holder is caught holding the lock and stopped there; on a
			// busy machine it may finish first, then it runs again.
			for try := 1; ; try++ {
				out := filepath.Join(t.TempDir(), "out")
				holder := startFerry(t, tt.args(out)...)
				if waitLockHolder(t, out+".lock", holder) < 0 {
					if try == 5 {
						t.Fatalf("%d runs finished before their lock was seen: exit %d: %s", try, holder.code, holder.stderr.String())
					}
					continue
				}
				holder.cmd.Process.Signal(syscall.SIGSTOP)
				h, err := lockfile.Read(out + ".lock")
				if err != nil || h == nil || h.PID != holder.cmd.Process.Pid {
					holder.cmd.Process.Signal(syscall.SIGCONT)
					holder.wait(t)
					continue // it let go of the lock before it stopped
				}
				if h.Command != tt.holder {
					t.Errorf("the lock records command %q, want %q", h.Command, tt.holder)
				}
				r := execFerry(t, nil, tt.args(out)...)
				host, _ := os.Hostname()
				want := fmt.Sprintf("output is locked by pid %d on host %s", h.PID, host)
				if r.code != exitFailure || !strings.Contains(r.stderr, want) || !strings.Contains(r.stderr, "("+tt.holder+")") {
					t.Errorf("second writer: exit %d, stderr %q; want exit 1 saying %q and naming (%s)", r.code, r.stderr, want, tt.holder)
				}
				holder.cmd.Process.Signal(syscall.SIGCONT)
				if code := holder.wait(t); code != 0 {
					t.Errorf("holder: exit %d: %s", code, holder.stderr.String())
				}
				return
			}
		})
	}
}

// Usage errors name the command as typed, a subcommand with its parent
// (main prints them after "ferry: ").
func TestUsageErrorNamesCommand(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"store", "verify"}, "store verify: want a store directory or a pipeline file"},
		{[]string{"pipeline", "status"}, "pipeline status: want one pipeline file"},
		{[]string{"gguf", "convert", "--jobs", "0", "-o", "x.gguf", "dir"}, "gguf convert: --jobs must be at least 1"},
		{[]string{"merge", "--jobs", "0", "--base", "b", "--adapter", "a", "--out", "o"}, "merge: --jobs must be at least 1"},
	} {
		out, code, err := runFerry(t, tt.args...)
		if code != exitBadInput || err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("ferry %s: exit %d, error %v (output %q); want exit 2, %q", strings.Join(tt.args, " "), code, err, out, tt.want)
		}
	}
}

// pipeline status names the store lock's holder with its command.
func TestPipelineStatusNamesLockHolder(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(file, []byte("name: p\nstore: .ferry\nstages:\n  - name: a\n    import: { path: a }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, ".ferry"), 0o755); err != nil {
		t.Fatal(err)
	}
	lock := `{"pid":1,"host":"elsewhere.example","started":"2026-01-02T03:04:05Z","command":"ferry pipeline run other.yaml"}`
	if err := os.WriteFile(filepath.Join(dir, ".ferry", "lock"), []byte(lock), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code, err := runFerry(t, "pipeline", "status", file)
	want := "store locked by pid 1 on host elsewhere.example since 2026-01-02T03:04:05Z (ferry pipeline run other.yaml)\n"
	if code != exitOK || !strings.Contains(out, want) {
		t.Errorf("exit %d (%v):\n%s\nwant a line %q", code, err, out, want)
	}
}
