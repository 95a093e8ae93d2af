package workers

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestEach: every job runs once, at most limit at a time, in index order
// of starting; the first error stops the rest and is returned; a parent
// context that ends stops Each with its cause.
func TestEach(t *testing.T) {
	for _, tc := range []struct{ n, limit int }{{0, 4}, {1, 4}, {10, 1}, {10, 3}, {3, 8}, {5, 0}} {
		var mu sync.Mutex
		var started []int
		ran := make([]int32, tc.n)
		var cur, peak atomic.Int32
		err := Each(context.Background(), tc.n, tc.limit, func(ctx context.Context, i int) error {
			c := cur.Add(1)
			for p := peak.Load(); c > p && !peak.CompareAndSwap(p, c); p = peak.Load() {
			}
			mu.Lock()
			started = append(started, i)
			mu.Unlock()
			time.Sleep(time.Millisecond)
			atomic.AddInt32(&ran[i], 1)
			cur.Add(-1)
			return nil
		})
		if err != nil {
			t.Fatalf("n %d, limit %d: %v", tc.n, tc.limit, err)
		}
		for i, r := range ran {
			if r != 1 {
				t.Errorf("n %d, limit %d: job %d ran %d times", tc.n, tc.limit, i, r)
			}
		}
		if want := int32(max(tc.limit, 1)); peak.Load() > want {
			t.Errorf("n %d, limit %d: %d jobs at once", tc.n, tc.limit, peak.Load())
		}
		if tc.limit == 1 {
			for i, s := range started {
				if s != i {
					t.Errorf("limit 1: job %d started %dth", s, i)
				}
			}
		}
	}

	boom := errors.New("boom")
	var after atomic.Int32
	err := Each(context.Background(), 100, 2, func(ctx context.Context, i int) error {
		switch {
		case i == 3:
			return boom
		case i > 3:
			after.Add(1)
			<-ctx.Done() // the failure cancels the running jobs
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Errorf("a failing job: %v, want its error", err)
	}
	if n := after.Load(); n > 1 {
		t.Errorf("%d jobs after the failing one ran; want at most the one running beside it", n)
	}

	ctx, cancel := context.WithCancel(context.Background())
	err = Each(ctx, 100, 2, func(ctx context.Context, i int) error {
		if i == 5 {
			cancel()
		}
		<-time.After(time.Millisecond)
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("parent cancelled: %v, want context.Canceled", err)
	}
}
