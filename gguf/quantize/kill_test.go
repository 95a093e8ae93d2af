package quantize

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/internal/benchtest"
	"github.com/ferry-llm/ferry/internal/killtest"
	"github.com/ferry-llm/ferry/internal/testmodel"
)

// The test binary doubles as the quantizer: with FERRY_QUANTIZE_CHILD set
// to IN:OUT:TYPE:JOBS[:JOURNAL_EVERY] it quantizes IN to OUT as `ferry
// quantize` does (plan, journal, resume) and exits: the kill test's child
// and the benchmark's measured process. A TYPE of several comma-separated
// types makes them all in one read, OUT a directory (`ferry quantize
// --type … --out-dir OUT`).
func init() {
	spec := os.Getenv("FERRY_QUANTIZE_CHILD")
	if spec == "" {
		return
	}
	parts := strings.Split(spec, ":")
	stop, err := benchtest.StartProfile() // the measured child's profile
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	err = childQuantize(parts)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

func childQuantize(parts []string) error {
	if len(parts) != 4 && len(parts) != 5 {
		return fmt.Errorf("FERRY_QUANTIZE_CHILD: want IN:OUT:TYPE:JOBS[:JOURNAL_EVERY], got %q", parts)
	}
	jobs, err := strconv.Atoi(parts[3])
	if err != nil {
		return err
	}
	var every time.Duration
	if len(parts) == 5 {
		if every, err = time.ParseDuration(parts[4]); err != nil {
			return err
		}
	}
	if strings.Contains(parts[2], ",") {
		// As `ferry quantize --out-dir` runs: the errors measured too.
		return childQuantizeMulti(parts[0], parts[1], strings.Split(parts[2], ","), RunOptions{Jobs: jobs, JournalEvery: every, Errors: true})
	}
	ft, err := ParseType(parts[2])
	if err != nil {
		return err
	}
	f, err := gguf.Open(parts[0])
	if err != nil {
		return err
	}
	defer f.Close()
	p, err := NewPlan(f, Options{FileType: ft})
	if err != nil {
		return err
	}
	_, err = Run(context.Background(), f, p, parts[1], RunOptions{Jobs: jobs, JournalEvery: every})
	return err
}

// A quantization SIGKILLed at 12 random moments, and run again after each,
// ends with the bytes of an uninterrupted run, and no kill leaves a file
// under the output's name that is not that whole file. The moments are
// drawn over the length of an uninterrupted run (measured here), so they
// fall before the first tensor, inside the write, and around the final
// fsync and rename. The children record durable tensors every 20 ms
// (not every second), so most kills inside the write leave a journal that
// the next run resumes from; the test fails unless some did (see
// killtest.AtRandom).
func TestKillAtRandomPoints(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a quantization 12 times; not in -short")
	}
	dir := t.TempDir()
	in := filepath.Join(dir, "in.gguf")
	// ~50 MB of F16 with an MTP block: 60-odd tensors.
	o := testmodel.GGUFOptions{Seed: 7, Layers: 3, NextN: true, Hidden: 512, FF: 2048, Vocab: 8192, Heads: 4, KVHeads: 2, HeadDim: 128}
	if _, err := o.WriteGGUF(in); err != nil {
		t.Fatal(err)
	}
	child := func(out string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "FERRY_QUANTIZE_CHILD="+in+":"+out+":Q8_0:2:20ms")
		return cmd
	}
	ref := filepath.Join(dir, "ref.gguf")
	start := time.Now()
	if b, err := child(ref).CombinedOutput(); err != nil {
		t.Fatalf("uninterrupted run: %v: %s", err, b)
	}
	full := time.Since(start)
	want, err := os.ReadFile(ref)
	if err != nil {
		t.Fatal(err)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d, uninterrupted run %v", seed, full)
	rng := rand.New(rand.NewPCG(seed, 0x9a17))
	out := filepath.Join(dir, "out.gguf")
	durable := func() bool {
		if j, err := os.ReadFile(out + ".journal"); err == nil && bytes.Contains(j, []byte(`"unit"`)) {
			_, err := os.Stat(gguf.PartialPath(out))
			return err == nil
		}
		return false
	}
	killtest.AtRandom(t, 12, full, rng, func() *exec.Cmd { return child(out) }, func(kill int) bool {
		b, err := os.ReadFile(out)
		if err != nil {
			return false
		}
		if !bytes.Equal(b, want) {
			t.Fatalf("kill %d: %s is there and is not the uninterrupted run's file", kill, out)
		}
		// Finished before the kill: start the next one from nothing.
		os.Remove(out)
		os.Remove(out + ".journal")
		return true
	}, durable)
	f, p, err := plan(t, in, Options{FileType: quant.FileQ8_0})
	if err != nil {
		t.Fatal(err)
	}
	rr, err := Run(context.Background(), f, p, out, RunOptions{Jobs: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the last run resumed %d of %d tensors", rr.Resumed, len(p.Tensors))
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("the output after 12 kills differs from an uninterrupted run")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 3 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("left in the directory: %v, want in.gguf, ref.gguf, out.gguf", names)
	}
}
