// Package cpushare hands a process's cores to the work running side by
// side in it, the most urgent first. A worker of work that runs in small
// units (row blocks of a conversion or a quantization) takes a slot of a
// Gate before its first unit, offers it between units (Yield: it goes to
// a waiter of higher priority, if one waits) and gives it back when it
// is done; a slot given back goes to the waiter of the highest priority.
// A worker that waits on something other than a core (its file, held by
// another worker's write that waits on the disk) gives its slot back for
// that time (Pause, Resume): a slot is a core kept busy, not a place in
// line.
// So while a stage of higher priority has units to make, the others get
// only the cores it leaves idle. Nothing is starved for good: a stage
// gets every slot the others do not use, and all of them once they are
// done.
//
// A pipeline run that shares its outputs gives the stages that make the
// most bytes the cores first: their uploads then overlap the stages that
// follow, instead of all of them ending, and uploading, at once. The
// parts of those uploads come before any stage (store.Options.Cores).
package cpushare

import (
	"container/heap"
	"context"
	"math"
	"sync"
)

// Gate is a number of slots (the cores the work may keep busy at once).
type Gate struct {
	mu      sync.Mutex
	free    int
	seq     uint64
	waiting waiters
}

// New is a gate of n slots (at least 1).
func New(n int) *Gate { return &Gate{free: max(n, 1)} }

type waiter struct {
	prio    int64
	seq     uint64 // first come, first served within a priority
	ch      chan struct{}
	granted bool
	index   int
}

type waiters []*waiter

func (w waiters) Len() int { return len(w) }
func (w waiters) Less(i, j int) bool {
	if w[i].prio != w[j].prio {
		return w[i].prio > w[j].prio
	}
	return w[i].seq < w[j].seq
}
func (w waiters) Swap(i, j int) {
	w[i], w[j] = w[j], w[i]
	w[i].index, w[j].index = i, j
}
func (w *waiters) Push(x any) {
	it := x.(*waiter)
	it.index = len(*w)
	*w = append(*w, it)
}
func (w *waiters) Pop() any {
	old := *w
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*w = old[:len(old)-1]
	it.index = -1
	return it
}

// Acquire takes a slot for work of priority prio, waiting while none is
// free; a slot given back goes to the waiter of the highest priority
// (the earliest among equals). It returns ctx's error, holding no slot,
// if ctx ends first.
func (g *Gate) Acquire(ctx context.Context, prio int64) error {
	g.mu.Lock()
	if g.free > 0 {
		g.free--
		g.mu.Unlock()
		return nil
	}
	return g.wait(ctx, prio)
}

// Yield offers the slot the caller holds for work of priority prio: to a
// waiter of a higher priority, if one waits, and then waits for a slot
// again as Acquire does (holding none if ctx ends first, with its
// error); else the caller keeps it.
func (g *Gate) Yield(ctx context.Context, prio int64) error {
	g.mu.Lock()
	if g.waiting.Len() == 0 || g.waiting[0].prio <= prio {
		g.mu.Unlock()
		return nil
	}
	g.releaseLocked()
	return g.wait(ctx, prio)
}

// wait queues the caller, g.mu held (and unlocked here), until a slot is
// handed to it or ctx ends.
func (g *Gate) wait(ctx context.Context, prio int64) error {
	g.seq++
	w := &waiter{prio: prio, seq: g.seq, ch: make(chan struct{})}
	heap.Push(&g.waiting, w)
	g.mu.Unlock()
	select {
	case <-w.ch:
		return nil
	case <-ctx.Done():
		g.mu.Lock()
		if w.granted {
			// Handed over as ctx ended: given on.
			g.releaseLocked()
		} else {
			heap.Remove(&g.waiting, w.index)
		}
		g.mu.Unlock()
		return ctx.Err()
	}
}

// Waiting is how many callers wait for a slot now.
func (g *Gate) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waiting.Len()
}

// Release gives back a slot Acquire took.
func (g *Gate) Release() {
	g.mu.Lock()
	g.releaseLocked()
	g.mu.Unlock()
}

func (g *Gate) releaseLocked() {
	if g.waiting.Len() == 0 {
		g.free++
		return
	}
	w := heap.Pop(&g.waiting).(*waiter)
	w.granted = true
	close(w.ch)
}

// Share is one piece of work's hold on a gate: its priority. A nil Share
// takes no slots (its methods do nothing), so work given none runs as it
// would without a gate.
type Share struct {
	g    *Gate
	prio int64
}

// Share is the hold of work of priority prio on g (nil for a nil g).
func (g *Gate) Share(prio int64) *Share {
	if g == nil {
		return nil
	}
	return &Share{g: g, prio: prio}
}

// Idle is a share of the same gate below all others: it gets only the
// slots no other work waits for (nil for a nil Share). Work that may run
// only on cores left idle (a merge's pass ahead of its writer) takes it.
func (s *Share) Idle() *Share {
	if s == nil {
		return nil
	}
	return &Share{g: s.g, prio: math.MinInt64}
}

// Priority is the share's priority (0 for a nil Share).
func (s *Share) Priority() int64 {
	if s == nil {
		return 0
	}
	return s.prio
}

// Acquire takes a slot (Gate.Acquire).
func (s *Share) Acquire(ctx context.Context) error {
	if s == nil {
		return ctx.Err()
	}
	return s.g.Acquire(ctx, s.prio)
}

// Yield offers the slot held (Gate.Yield).
func (s *Share) Yield(ctx context.Context) error {
	if s == nil {
		return ctx.Err()
	}
	return s.g.Yield(ctx, s.prio)
}

// Release gives back a slot Acquire took.
func (s *Share) Release() {
	if s != nil {
		s.g.Release()
	}
}

// Hold is a worker's slot, taken for its units: Yield between them, Done
// at the end (a nil Share's Hold holds nothing).
type Hold struct {
	s    *Share
	held bool
}

// Hold takes a slot for a worker (Acquire), or returns ctx's error
// holding none.
func (s *Share) Hold(ctx context.Context) (*Hold, error) {
	if err := s.Acquire(ctx); err != nil {
		return nil, err
	}
	return &Hold{s: s, held: true}, nil
}

// Yield offers the slot between two units (Gate.Yield); after an error
// the worker holds none.
func (h *Hold) Yield(ctx context.Context) error {
	err := h.s.Yield(ctx)
	if err != nil {
		h.held = false
	}
	return err
}

// Pause gives the slot back while the worker waits on something other
// than a core (a lock another worker of its own holds while the disk is
// slow): other work gets the core meanwhile instead of it standing idle.
// Resume takes a slot again; a paused worker that stops calls Done as
// usual.
func (h *Hold) Pause() {
	if h.held {
		h.held = false
		h.s.Release()
	}
}

// Resume takes a slot again after Pause (Acquire: behind waiters of a
// higher priority), or returns ctx's error holding none. It does nothing
// for a worker holding its slot.
func (h *Hold) Resume(ctx context.Context) error {
	if h.held {
		return nil
	}
	if err := h.s.Acquire(ctx); err != nil {
		return err
	}
	h.held = true
	return nil
}

// Done gives the slot back, if held.
func (h *Hold) Done() {
	if h.held {
		h.held = false
		h.s.Release()
	}
}
