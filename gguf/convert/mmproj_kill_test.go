package convert

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
	"github.com/ferry-llm/ferry/internal/killtest"
	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/safetensors"
)

// With FERRY_MMPROJ_CHILD=DIR:OUT:JOBS:JOURNAL_EVERY the test binary writes
// DIR's vision tower to OUT as `ferry gguf convert --mmproj` does (plan,
// journal, resume) and exits: the kill test's child.
func init() {
	spec := os.Getenv("FERRY_MMPROJ_CHILD")
	if spec == "" {
		return
	}
	if err := childMMProj(strings.Split(spec, ":")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

func childMMProj(parts []string) error {
	if len(parts) != 4 {
		return fmt.Errorf("FERRY_MMPROJ_CHILD: want DIR:OUT:JOBS:JOURNAL_EVERY, got %q", parts)
	}
	jobs, err := strconv.Atoi(parts[2])
	if err != nil {
		return err
	}
	every, err := time.ParseDuration(parts[3])
	if err != nil {
		return err
	}
	ck, err := safetensors.OpenDir(parts[0])
	if err != nil {
		return err
	}
	defer ck.Close()
	p, err := NewPlan(ck, Options{MMProj: true})
	if err != nil {
		return err
	}
	_, err = Run(context.Background(), ck, p, parts[1], RunOptions{Jobs: jobs, JournalEvery: every})
	return err
}

// An mmproj write SIGKILLed at 10 random moments, and run again after each,
// ends with the bytes of an uninterrupted run; no kill leaves a file under
// the output's name that is not that whole file, and some kill left a
// journal the next run resumed from (killtest.AtRandom). The vision tower
// is a generated one of 21 MB (BF16), so the write lasts long enough to be
// cut; the children record durable tensors every 5 ms.
func TestKillMMProj(t *testing.T) {
	if testing.Short() {
		t.Skip("kills an mmproj write 10 times; not in -short")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "base")
	if _, err := (testmodel.Qwen35Options{ConditionalGeneration: true, Common: testmodel.Common{Seed: 5, MaxShardSize: 4 << 20},
		Vision: &testmodel.Vision{HiddenSize: 512, IntermediateSize: 2048, NumHeads: 8}}).Write(src); err != nil {
		t.Fatal(err)
	}
	child := func(out string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "FERRY_MMPROJ_CHILD="+src+":"+out+":2:5ms")
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
	t.Logf("seed %d, uninterrupted run %v, %d bytes", seed, full, len(want))
	rng := rand.New(rand.NewPCG(seed, 0x3a11))
	out := filepath.Join(dir, "mmproj.gguf")
	durable := func() bool {
		if j, err := os.ReadFile(out + ".journal"); err == nil && bytes.Contains(j, []byte(`"unit"`)) {
			_, err := os.Stat(gguf.PartialPath(out))
			return err == nil
		}
		return false
	}
	killtest.AtRandom(t, 10, full, rng, func() *exec.Cmd { return child(out) }, func(kill int) bool {
		b, err := os.ReadFile(out)
		if err != nil {
			return false
		}
		if !bytes.Equal(b, want) {
			t.Fatalf("kill %d: %s is there and is not the uninterrupted run's file", kill, out)
		}
		os.Remove(out)
		os.Remove(out + ".journal")
		return true
	}, durable)
	// The last run finishes what the kills left.
	if b, err := child(out).CombinedOutput(); err != nil {
		t.Fatalf("final run: %v: %s", err, b)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("resumed mmproj differs from the uninterrupted run's")
	}
	for _, leftover := range []string{out + ".journal", gguf.PartialPath(out)} {
		if _, err := os.Stat(leftover); !os.IsNotExist(err) {
			t.Errorf("%s left behind (%v)", leftover, err)
		}
	}
}
