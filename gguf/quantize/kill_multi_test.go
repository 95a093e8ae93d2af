package quantize

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/internal/killtest"
	"github.com/ferry-llm/ferry/internal/testmodel"
)

// childQuantizeMulti makes every type of src into dir in one RunMulti.
func childQuantizeMulti(src, dir string, types []string, ro RunOptions) error {
	s, err := OpenSource(src, SourceOptions{})
	if err != nil {
		return err
	}
	defer s.Close()
	outs, err := planOutputs(s, types, dir)
	if err != nil {
		return err
	}
	_, err = RunMulti(context.Background(), s.File, outs, ro)
	return err
}

// planOutputs plans every type of s, each output named in dir as `ferry
// quantize --out-dir` names it.
func planOutputs(s *Source, types []string, dir string) ([]Output, error) {
	var outs []Output
	for _, name := range types {
		ft, err := ParseType(name)
		if err != nil {
			return nil, err
		}
		p, err := s.NewPlan(Options{FileType: ft})
		if err != nil {
			return nil, err
		}
		outs = append(outs, Output{Plan: p, Path: filepath.Join(dir, OutputName(s.Stem(), ft))})
	}
	return outs, nil
}

// A three-output run SIGKILLed at 6 random moments, and run again after
// each, ends with every output byte-identical to an uninterrupted run's;
// no kill leaves a file under an output's name that is not that whole
// file, and some kill must leave journals the next run resumes from (see
// killtest.AtRandom).
func TestKillMultiAtRandomPoints(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a three-type quantization 6 times; not in -short")
	}
	dir := t.TempDir()
	in := filepath.Join(dir, "in-F16.gguf")
	o := testmodel.GGUFOptions{Seed: 11, Layers: 2, NextN: true, Hidden: 256, FF: 512, Vocab: 2048, Heads: 4, KVHeads: 2, HeadDim: 64}
	if _, err := o.WriteGGUF(in); err != nil {
		t.Fatal(err)
	}
	types := "Q6_K,Q4_K_M,Q2_K"
	child := func(out string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "FERRY_QUANTIZE_CHILD="+in+":"+out+":"+types+":2:20ms")
		return cmd
	}
	names := []string{"in-Q6_K.gguf", "in-Q4_K_M.gguf", "in-Q2_K.gguf"}
	refDir, out := filepath.Join(dir, "ref"), filepath.Join(dir, "out")
	for _, d := range []string{refDir, out} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if b, err := child(refDir).CombinedOutput(); err != nil {
		t.Fatalf("uninterrupted run: %v: %s", err, b)
	}
	full := time.Since(start)
	want := map[string][]byte{}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(refDir, n))
		if err != nil {
			t.Fatal(err)
		}
		want[n] = b
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d, uninterrupted run %v", seed, full)
	rng := rand.New(rand.NewPCG(seed, 0x3a11))
	// durable: some output has a partial file and a journal that records a
	// finished tensor.
	durable := func() bool {
		for _, n := range names {
			p := filepath.Join(out, n)
			if j, err := os.ReadFile(p + ".journal"); err == nil && bytes.Contains(j, []byte(`"unit"`)) {
				if _, err := os.Stat(gguf.PartialPath(p)); err == nil {
					return true
				}
			}
		}
		return false
	}
	killtest.AtRandom(t, 6, full, rng, func() *exec.Cmd { return child(out) }, func(kill int) bool {
		finished := 0
		for _, n := range names {
			b, err := os.ReadFile(filepath.Join(out, n))
			if err != nil {
				continue
			}
			if !bytes.Equal(b, want[n]) {
				t.Fatalf("kill %d: %s is there and is not the uninterrupted run's file", kill, n)
			}
			finished++
		}
		if finished < len(names) {
			return false
		}
		// Finished before the kill: start the next one from nothing.
		ents, _ := os.ReadDir(out)
		for _, e := range ents {
			os.Remove(filepath.Join(out, e.Name()))
		}
		return true
	}, durable)
	if b, err := child(out).CombinedOutput(); err != nil {
		t.Fatalf("last run: %v: %s", err, b)
	}
	var left []string
	ents, _ := os.ReadDir(out)
	for _, e := range ents {
		left = append(left, e.Name())
	}
	slices.Sort(left)
	if wantLeft := slices.Sorted(slices.Values(names)); !slices.Equal(left, wantLeft) {
		t.Errorf("left in the output directory: %s, want %s", strings.Join(left, ", "), strings.Join(wantLeft, ", "))
	}
	for _, n := range names {
		if b, err := os.ReadFile(filepath.Join(out, n)); err != nil || !bytes.Equal(b, want[n]) {
			t.Errorf("%s after 6 kills differs from an uninterrupted run (%v)", n, err)
		}
	}
}
