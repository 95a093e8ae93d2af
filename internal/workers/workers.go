// Package workers runs independent jobs on a few goroutines: the files of
// an import, the shards of a merge.
package workers

import (
	"context"
	"sync"
)

// Each runs do(ctx, i) for every i in [0, n) on up to limit goroutines
// (at least one), jobs taken in index order. The first error cancels the
// context the running jobs see, no job starts after it, and Each returns
// it; a ctx that ends stops Each the same way with ctx's cause. Each
// returns once every started job has returned.
func Each(ctx context.Context, n, limit int, do func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(n, max(limit, 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if ctx.Err() != nil {
					return // a job taken as the run was stopped
				}
				if err := do(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		}()
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}
