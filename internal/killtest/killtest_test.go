package killtest

import (
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// Every random moment (in a 1 ns "run") comes before the child's first
// durable work, a file it creates after 1 s (a margin the slowest loaded machine keeps: with 50 ms, a load average of 14 on 2 cores let a child outlive it before its kill): AtRandom must fall back to
// one more kill after the file appears, and pass.
func TestAtRandomFallsBack(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	mark := filepath.Join(t.TempDir(), "durable")
	starts := 0
	AtRandom(t, 3, time.Nanosecond, rand.New(rand.NewPCG(1, 2)), func() *exec.Cmd {
		starts++
		return exec.Command("sh", "-c", `sleep 1; : > "$1"; exec sleep 30`, "sh", mark)
	}, func(int) bool { return false }, func() bool {
		_, err := os.Stat(mark)
		return err == nil
	})
	if starts != 4 {
		t.Errorf("%d children started, want 3 random kills and 1 after the durable work", starts)
	}
}
