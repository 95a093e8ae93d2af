package mlxpack

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/ferry-llm/ferry/internal/testmodel"
)

// Progress is told every rewritten shard's bytes, written or found
// unchanged, and they add up to RewriteBytes.
func TestRepackProgress(t *testing.T) {
	src := writeFixture(t, testmodel.CompressedQwen3(3))
	dst := filepath.Join(t.TempDir(), "mlx")
	for _, run := range []string{"write", "unchanged"} {
		var done atomic.Int64
		plan, err := PlanRepack(src, Options{Rewrite: true, Jobs: 2, Progress: func(n int64) { done.Add(n) }})
		if err != nil {
			t.Fatal(err)
		}
		res, err := Repack(context.Background(), plan, dst)
		plan.Close()
		if err != nil {
			t.Fatal(err)
		}
		if total := plan.RewriteBytes(); total == 0 || done.Load() != total {
			t.Errorf("%s: progress %d bytes, RewriteBytes %d", run, done.Load(), total)
		}
		if run == "write" && res.NewBytes <= done.Load() { // new bytes add the index and config.json
			t.Errorf("progress %d bytes, new bytes %d", done.Load(), res.NewBytes)
		}
	}
}
