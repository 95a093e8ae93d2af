package merge

import (
	"context"
	"github.com/ferry-llm/ferry/internal/cpushare"
	"sync"
)

// block is one worker's buffers for a row block.
type block struct {
	start, n int
	raw      []byte    // base bytes, then output bytes
	w, d     []float32 // base rows, delta rows (then V)
	colSq    []float64 // first pass: column sums of squares
	out      []byte
	// nonFinite counts NaN/Inf of the base carried into out.
	nonFinite int64
}

// getBlock returns a block buffer for elems elements of up to width bytes.
func (e *executor) getBlock(elems, width int) *block {
	var b *block
	select {
	case b = <-e.free:
	default:
		b = &block{}
	}
	if cap(b.w) < elems {
		b.w = make([]float32, elems)
		b.d = make([]float32, elems)
	}
	if cap(b.raw) < elems*width {
		b.raw = make([]byte, elems*width)
	}
	b.w, b.d, b.raw = b.w[:elems], b.d[:elems], b.raw[:elems*width]
	return b
}

func (e *executor) putBlock(b *block) {
	select {
	case e.free <- b:
	default:
	}
}

// ordered runs work(i) for i in [0, n) on up to jobs goroutines and hands
// the results to consume in index order, one at a time. At most jobs blocks
// are alive at once.
func ordered(ctx context.Context, n, jobs int, cores *cpushare.Share, work func(i int) (*block, error), consume func(*block) error) error {
	type result struct {
		b   *block
		err error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	slots := make([]chan result, n)
	for i := range slots {
		slots[i] = make(chan result, 1)
	}
	sem := make(chan struct{}, jobs)
	var wg sync.WaitGroup
	producerDone := make(chan struct{})
	go func() {
		defer close(producerDone)
		for i := 0; i < n; i++ {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				// A core of the process's, for the block's compute only:
				// a worker waiting for the writer holds none.
				if err := cores.Acquire(ctx); err != nil {
					slots[i] <- result{nil, err}
					return
				}
				b, err := work(i)
				cores.Release()
				slots[i] <- result{b, err}
			}(i)
		}
	}()
	var first error
	for i := 0; i < n && first == nil; i++ {
		select {
		case r := <-slots[i]:
			if r.err != nil {
				first = r.err
			} else if err := consume(r.b); err != nil {
				first = err
			}
			<-sem
		case <-ctx.Done():
			first = ctx.Err()
		}
	}
	cancel()
	<-producerDone
	wg.Wait() // started workers finish before their buffers are dropped
	return first
}
