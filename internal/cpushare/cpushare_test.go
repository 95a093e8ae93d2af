package cpushare

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// waitingLen is how many Acquire calls wait.
func (g *Gate) waitingLen() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waiting.Len()
}

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
