package cpushare

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

func (g *Gate) waitingLen() int { return g.Waiting() }

// enqueue starts an Acquire of prio that records prio in got once it
// holds a slot, and returns once it waits.
func enqueue(t *testing.T, g *Gate, prio int64, mu *sync.Mutex, got *[]int64, done *sync.WaitGroup) {
	t.Helper()
	n := g.waitingLen()
	done.Add(1)
	go func() {
		defer done.Done()
		if err := g.Acquire(context.Background(), prio); err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		*got = append(*got, prio)
		mu.Unlock()
	}()
	for g.waitingLen() == n {
		time.Sleep(time.Millisecond)
	}
}

// A slot given back goes to the highest priority waiting, the earliest
// first among equals; with none waiting it is free again.
func TestGateOrder(t *testing.T) {
	for _, c := range []struct {
		name  string
		prios []int64
		want  []int64
	}{
		{"by priority", []int64{1, 5, 3}, []int64{5, 3, 1}},
		{"equals in order", []int64{2, 2, 7, 2}, []int64{7, 2, 2, 2}},
		{"one", []int64{0}, []int64{0}},
		{"negative last", []int64{-1, 0, 9}, []int64{9, 0, -1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := New(1)
			if err := g.Acquire(context.Background(), 0); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var got []int64
			var done sync.WaitGroup
			for _, p := range c.prios {
				enqueue(t, g, p, &mu, &got, &done)
			}
			// Hand the slot down the queue, one holder at a time.
			for i := range c.prios {
				g.Release()
				for {
					mu.Lock()
					n := len(got)
					mu.Unlock()
					if n == i+1 {
						break
					}
					time.Sleep(time.Millisecond)
				}
			}
			done.Wait()
			if !slices.Equal(got, c.want) {
				t.Errorf("order %v, want %v", got, c.want)
			}
			g.Release()
			if g.free != 1 || g.waitingLen() != 0 {
				t.Errorf("free %d, waiting %d: want 1, 0", g.free, g.waitingLen())
			}
		})
	}
}

// A waiter whose context ends leaves the queue with no slot, and the slot
// it would have had goes to the next.
func TestGateCancel(t *testing.T) {
	g := New(1)
	if err := g.Acquire(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() { errc <- g.Acquire(ctx, 9) }()
	for g.waitingLen() == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-errc; err != context.Canceled {
		t.Fatalf("cancelled Acquire: %v", err)
	}
	if g.waitingLen() != 0 {
		t.Fatal("the cancelled waiter is still queued")
	}
	g.Release()
	if g.free != 1 {
		t.Fatalf("free %d after the release, want 1", g.free)
	}
}

// Many acquirers with contexts that end at random moments (some as their
// slot is handed over): every slot comes back, none is held twice.
func TestGateStress(t *testing.T) {
	const slots = 3
	g := New(slots)
	var held, peak int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 7))
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.IntN(3000))*time.Microsecond)
			defer cancel()
			if err := g.Acquire(ctx, int64(r.IntN(4))); err != nil {
				return
			}
			mu.Lock()
			held++
			peak = max(peak, held)
			mu.Unlock()
			time.Sleep(time.Duration(r.IntN(200)) * time.Microsecond)
			mu.Lock()
			held--
			mu.Unlock()
			g.Release()
		}()
	}
	wg.Wait()
	if peak > slots {
		t.Errorf("%d slots held at once, gate of %d", peak, slots)
	}
	if g.free != slots || g.waitingLen() != 0 {
		t.Errorf("free %d, waiting %d at the end: want %d, 0", g.free, g.waitingLen(), slots)
	}
}

// A nil Share holds nothing and never waits.
func TestNilShare(t *testing.T) {
	var g *Gate
	s := g.Share(5)
	if s != nil {
		t.Fatal("a nil gate's share is not nil")
	}
	for range 3 {
		if err := s.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	s.Release()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if s.Acquire(ctx) == nil {
		t.Error("a nil share's Acquire on an ended context: no error")
	}
}

// Yield hands the slot held to a waiter of strictly higher priority
// only, and then waits for one again; a waiter of the same or a lower
// priority leaves it with the caller.
func TestGateYield(t *testing.T) {
	ctx := context.Background()
	g := New(1)
	if err := g.Acquire(ctx, 5); err != nil {
		t.Fatal(err)
	}
	// Lower and equal waiters: the holder keeps its slot.
	got := make(chan int64, 3)
	for _, p := range []int64{1, 5} {
		n := g.waitingLen()
		go func() {
			if err := g.Acquire(ctx, p); err == nil {
				got <- p
			}
		}()
		for g.waitingLen() == n {
			time.Sleep(time.Millisecond)
		}
	}
	kept := make(chan error, 1)
	go func() { kept <- g.Yield(ctx, 5) }()
	if err := recv(t, kept); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-got:
		t.Fatalf("Yield handed the slot to a waiter of priority %d, not above the holder's 5", p)
	case <-time.After(20 * time.Millisecond):
	}
	// A higher waiter: Yield hands it over and queues the caller again.
	go func() {
		if err := g.Acquire(ctx, 9); err == nil {
			got <- 9
		}
	}()
	for g.waitingLen() != 3 {
		time.Sleep(time.Millisecond)
	}
	yielded := make(chan error)
	go func() { yielded <- g.Yield(ctx, 5) }()
	if p := recv(t, got); p != 9 {
		t.Fatalf("the slot went to priority %d, want 9", p)
	}
	// 9 gives it back: the 5 that waited before the yielder gets it,
	// then the yielder, then the 1.
	g.Release()
	if p := recv(t, got); p != 5 {
		t.Fatalf("the slot went to priority %d, want the first 5 waiting", p)
	}
	g.Release()
	if err := recv(t, yielded); err != nil {
		t.Fatal(err)
	}
	g.Release()
	if p := recv(t, got); p != 1 {
		t.Fatalf("the slot went to priority %d, want 1", p)
	}
	g.Release()
	if g.free != 1 || g.waitingLen() != 0 {
		t.Errorf("free %d, waiting %d: want 1, 0", g.free, g.waitingLen())
	}

	// A yielder whose context ends while it waits again holds nothing.
	g = New(1)
	if err := g.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	go func() {
		if err := g.Acquire(ctx, 9); err == nil {
			got <- 9
		}
	}()
	for g.waitingLen() == 0 {
		time.Sleep(time.Millisecond)
	}
	cctx, cancel := context.WithCancel(ctx)
	yielded = make(chan error)
	go func() { yielded <- g.Yield(cctx, 1) }()
	recv(t, got)
	for g.waitingLen() == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := recv(t, yielded); err != context.Canceled {
		t.Fatalf("Yield on a cancelled context: %v", err)
	}
	g.Release()
	if g.free != 1 || g.waitingLen() != 0 {
		t.Errorf("free %d, waiting %d: want 1, 0", g.free, g.waitingLen())
	}
}

// Workers that hold a slot across their units and yield between them:
// until a higher-priority worker is done and gives its slot back, the
// lower-priority ones make no unit, however the two interleave.
func TestGateYieldStrict(t *testing.T) {
	const slots, units = 4, 200
	ctx := context.Background()
	g := New(slots)
	var highLeft sync.WaitGroup
	var mu sync.Mutex
	highRunning, lowDuringHigh, lowDone := slots, 0, 0
	worker := func(prio int64, n int, each func()) {
		if err := g.Acquire(ctx, prio); err != nil {
			t.Error(err)
			return
		}
		for range n {
			if err := g.Yield(ctx, prio); err != nil {
				t.Error(err)
				return
			}
			each()
		}
		g.Release()
	}
	// The high-priority workers take every slot first.
	for range slots {
		if err := g.Acquire(ctx, 10); err != nil {
			t.Fatal(err)
		}
	}
	var lowWG sync.WaitGroup
	for range 2 * slots {
		lowWG.Add(1)
		go func() {
			defer lowWG.Done()
			worker(1, units, func() {
				mu.Lock()
				if highRunning == slots {
					lowDuringHigh++
				}
				lowDone++
				mu.Unlock()
			})
		}()
	}
	for g.waitingLen() < 2*slots {
		time.Sleep(time.Millisecond)
	}
	for range slots {
		highLeft.Add(1)
		go func() {
			defer highLeft.Done()
			for range units {
				if err := g.Yield(ctx, 10); err != nil {
					t.Error(err)
					return
				}
				time.Sleep(20 * time.Microsecond)
			}
			mu.Lock()
			highRunning--
			mu.Unlock()
			g.Release()
		}()
	}
	highLeft.Wait()
	lowWG.Wait()
	if lowDuringHigh != 0 {
		t.Errorf("%d low-priority units made before a high-priority worker was done", lowDuringHigh)
	}
	if lowDone != 2*slots*units {
		t.Errorf("%d low-priority units made, want %d", lowDone, 2*slots*units)
	}
	if g.free != slots || g.waitingLen() != 0 {
		t.Errorf("free %d, waiting %d: want %d, 0", g.free, g.waitingLen(), slots)
	}
}

// recv is what ch yields, or a failure after 5 s.
func recv[T any](t *testing.T, ch chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		t.Fatal("nothing came in 5 s")
	}
	var zero T
	return zero
}

// Hold: Done gives the slot back once, and not after a Yield that ended
// holding none; a nil Share's Hold holds nothing.
func TestHold(t *testing.T) {
	ctx := context.Background()
	g := New(1)
	h, err := g.Share(1).Hold(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h.Done()
	h.Done()
	if g.free != 1 {
		t.Fatalf("free %d after Done twice, want 1", g.free)
	}
	// A Yield cut short by its context leaves nothing to give back.
	h, err = g.Share(1).Hold(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- g.Acquire(ctx, 9) }()
	for g.Waiting() == 0 {
		time.Sleep(time.Millisecond)
	}
	cctx, cancel := context.WithCancel(ctx)
	yielded := make(chan error, 1)
	go func() { yielded <- h.Yield(cctx) }()
	if err := recv(t, got); err != nil {
		t.Fatal(err)
	}
	for g.Waiting() == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := recv(t, yielded); err != context.Canceled {
		t.Fatalf("Yield: %v, want cancelled", err)
	}
	h.Done()
	g.Release() // the priority-9 holder's
	if g.free != 1 || g.Waiting() != 0 {
		t.Errorf("free %d, waiting %d: want 1, 0", g.free, g.Waiting())
	}
	var s *Share
	nh, err := s.Hold(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := nh.Yield(ctx); err != nil {
		t.Fatal(err)
	}
	nh.Done()
}

// Pause gives a worker's slot back and Resume takes one again, behind
// waiters of a higher priority; Resume ended by its context leaves the
// worker holding none, and Done then gives nothing back.
func TestHoldPause(t *testing.T) {
	g := New(1)
	ctx := context.Background()
	h, err := g.Share(5).Hold(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Resume(ctx); err != nil { // held: nothing to do
		t.Fatal(err)
	}
	h.Pause()
	h.Pause() // paused already: nothing more given back
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := g.Acquire(tctx, 1); err != nil {
		t.Fatalf("the slot a paused worker gave back: %v", err)
	}
	// Held by the lower work: a higher waiter, then the resuming worker.
	higher := make(chan error)
	go func() { higher <- g.Acquire(ctx, 9) }()
	for g.Waiting() < 1 {
		time.Sleep(time.Millisecond)
	}
	resumed := make(chan error)
	go func() { resumed <- h.Resume(ctx) }()
	for g.Waiting() < 2 {
		time.Sleep(time.Millisecond)
	}
	g.Release() // the lower work's slot: to the higher waiter first
	if err := <-higher; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-resumed:
		t.Fatalf("resumed (%v) while the higher waiter holds the only slot", err)
	case <-time.After(20 * time.Millisecond):
	}
	g.Release()
	if err := <-resumed; err != nil {
		t.Fatal(err)
	}
	h.Done()

	// A Resume its context ends holds nothing: Done gives nothing back.
	h, err = g.Share(5).Hold(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h.Pause()
	if err := g.Acquire(ctx, 1); err != nil { // someone else takes it
		t.Fatal(err)
	}
	cctx, ccancel := context.WithCancel(ctx)
	ccancel()
	if err := h.Resume(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Resume with its context ended: %v", err)
	}
	h.Done()
	g.Release()
	if err := g.Acquire(tctx, 1); err != nil {
		t.Fatalf("the gate's one slot is not free: %v", err)
	}
	if err := g.Acquire(ctx20ms(t), 1); err == nil {
		t.Fatal("two slots taken from a gate of one: Done gave back a slot it did not hold")
	}
}

func ctx20ms(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	t.Cleanup(cancel)
	return ctx
}

// An idle share gets a slot only when no other work waits: after every
// waiter of any priority, a negative one included; a nil share's is nil.
func TestIdleShare(t *testing.T) {
	g := New(1)
	if err := g.Acquire(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	idle := g.Share(7).Idle()
	var mu sync.Mutex
	var got []int64
	var done sync.WaitGroup
	n := g.waitingLen()
	done.Add(1)
	go func() {
		defer done.Done()
		if err := idle.Acquire(context.Background()); err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		got = append(got, idle.Priority())
		mu.Unlock()
		idle.Release()
	}()
	for g.waitingLen() == n {
		time.Sleep(time.Millisecond)
	}
	for _, p := range []int64{-1 << 40, 3} {
		enqueue(t, g, p, &mu, &got, &done)
	}
	for range 3 {
		g.Release()
		time.Sleep(5 * time.Millisecond)
	}
	done.Wait()
	if want := []int64{3, -1 << 40, idle.Priority()}; !slices.Equal(got, want) {
		t.Errorf("slots went to %v, want %v (the idle share last)", got, want)
	}
	var none *Share
	if none.Idle() != nil {
		t.Error("a nil share's idle share is not nil")
	}
}
