package pipeline

import (
	"context"

	"golang.org/x/sync/semaphore"
)

// scheduler decides when a stage of a run may start: at most Options.Stages
// at once, and only while the memory estimates of the running stages,
// its own included, fit in Options.Memory. Waiters are served in the
// order they came (semaphore.Weighted is FIFO), so a big stage is not
// starved by small ones. A stage whose estimate is over the whole budget
// takes all of it: it waits for the running stages to end and runs alone.
type scheduler struct {
	slots  *semaphore.Weighted
	memory *semaphore.Weighted
	budget int64
}

func newScheduler(stages int, budget int64) *scheduler {
	return &scheduler{slots: semaphore.NewWeighted(int64(stages)), memory: semaphore.NewWeighted(budget), budget: budget}
}

// acquire waits until a stage estimated at mem bytes may start; release
// when it ends.
func (s *scheduler) acquire(ctx context.Context, mem int64) (release func(), err error) {
	if err := s.slots.Acquire(ctx, 1); err != nil {
		return nil, err
	}
	n := min(max(mem, 1), s.budget)
	if err := s.memory.Acquire(ctx, n); err != nil {
		s.slots.Release(1)
		return nil, err
	}
	return func() { s.memory.Release(n); s.slots.Release(1) }, nil
}
