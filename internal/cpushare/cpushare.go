// Package cpushare hands a process's cores to the work running side by
// side in it, the most urgent first. Work that runs in small units (a row
// block of a conversion or a quantization) takes a slot of a Gate for
// each unit and gives it back after; a slot given back goes to the
// waiting unit of the highest priority, so while a stage of higher
// priority has units to make the others get only the cores it leaves
// idle. Nothing is starved for good: a stage gets every slot the others
// do not wait for, and all of them once the others are done.
//
// A pipeline run that shares its outputs gives the stages that make the
// most bytes the cores first: their uploads then overlap the stages that
// follow, instead of all of them ending, and uploading, at once.
package cpushare

import (
	"container/heap"
	"context"
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

// Release gives back a slot Acquire took.
func (s *Share) Release() {
	if s != nil {
		s.g.Release()
	}
}
