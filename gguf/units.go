package gguf

import (
	"context"
	"runtime"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/ferry-llm/ferry/internal/cpushare"
)

// Unit is rows [R0, R1) of tensor T: what one worker makes and writes at
// a time when a tensor is written in row blocks (gguf convert, quantize).
type Unit struct {
	T      int
	R0, R1 int64
}

// SplitRows appends tensor t's units to units: its rows in blocks of at
// most per rows, in order (one empty unit for a tensor of no rows).
func SplitRows(units []Unit, t int, rows, per int64) []Unit {
	per = max(per, 1)
	for r := int64(0); r < rows; r += per {
		units = append(units, Unit{t, r, min(rows, r+per)})
	}
	if rows == 0 {
		units = append(units, Unit{t, 0, 0})
	}
	return units
}

// UnitWork says how WriteUnits makes and reports the units.
type UnitWork struct {
	// Jobs is the number of workers (default: GOMAXPROCS).
	Jobs int
	// Make makes unit k on worker (0 ≤ worker < Jobs, for its scratch
	// buffers): the bytes and their offset within the unit's tensor. The
	// bytes are written before the worker makes another unit.
	Make func(worker, k int) (data []byte, off int64, err error)
	// Written, if set, is called on the worker once unit k's bytes are in
	// the file.
	Written func(worker, k int)
	// Done, if set, is called once every unit of tensor t is written (and
	// the tensor marked finished), on the worker that wrote the last one.
	Done func(t int)
	// Also, if set, runs beside the workers (a hasher following the
	// writes); its error stops them, and theirs cancels its context.
	Also func(ctx context.Context) error
	// Cores, if set, is held by each worker from its first unit to its
	// last and offered between units (cpushare.Share.Yield): the
	// process's cores shared with other work by priority.
	Cores *cpushare.Share
}

// WriteUnits makes and writes units (in order of k, by uw.Jobs workers at
// once): each worker makes a unit and writes it at its offset itself, so
// the bytes are still in its core's cache when pwrite copies them into the
// page cache. What the file holds does not depend on the worker count.
// It returns the first error (ctx's when it is cancelled); the caller then
// detaches or aborts the writer.
func (w *Writer) WriteUnits(ctx context.Context, units []Unit, uw UnitWork) error {
	mw := MultiUnitWork{Jobs: uw.Jobs, Written: uw.Written, Also: uw.Also, Cores: uw.Cores,
		Make: func(worker, k int) ([][]byte, []int64, error) {
			data, off, err := uw.Make(worker, k)
			return [][]byte{data}, []int64{off}, err
		},
	}
	if uw.Done != nil {
		mw.Done = func(_, t int) { uw.Done(t) }
	}
	return WriteUnitsMulti(ctx, []*Writer{w}, units, mw)
}

// MultiUnitWork says how WriteUnitsMulti makes and reports the units of
// several files made from one source (quantize's outputs of one read).
type MultiUnitWork struct {
	// Jobs is the number of workers (default: GOMAXPROCS).
	Jobs int
	// Make makes unit k on worker: for each writer o, the bytes and their
	// offset within the unit's tensor, data[o] nil where Writes(o, T) is
	// false. The bytes are written before the worker makes another unit.
	Make func(worker, k int) (data [][]byte, off []int64, err error)
	// Writes, if set, says whether tensor t is written to writer o (false:
	// the caller skipped it there, e.g. resumed); nil writes every tensor
	// of the units to every writer.
	Writes func(o, t int) bool
	// Written, if set, is called on the worker once unit k's bytes are in
	// the files.
	Written func(worker, k int)
	// Done, if set, is called once every unit of tensor t is written to
	// writer o (and the tensor marked finished there), on the worker that
	// wrote the last one.
	Done func(o, t int)
	// Also, if set, runs beside the workers (a hasher following the
	// writes); its error stops them, and theirs cancels its context.
	Also func(ctx context.Context) error
	// Cores, if set, is held by each worker and offered between units
	// (UnitWork.Cores).
	Cores *cpushare.Share
}

// WriteUnitsMulti is WriteUnits for several writers at once: each unit is
// made once and its pieces written to the writers that take its tensor.
func WriteUnitsMulti(ctx context.Context, ws []*Writer, units []Unit, uw MultiUnitWork) error {
	jobs := uw.Jobs
	if jobs <= 0 {
		jobs = runtime.GOMAXPROCS(0)
	}
	writes := func(o, t int) bool { return uw.Writes == nil || uw.Writes(o, t) }
	remaining := make([][]atomic.Int64, len(ws))
	for o, w := range ws {
		remaining[o] = make([]atomic.Int64, len(w.layout.Tensors))
		for _, u := range units {
			if writes(o, u.T) {
				remaining[o][u.T].Add(1)
			}
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	ch := make(chan int)
	g.Go(func() error {
		defer close(ch)
		for k := range units {
			select {
			case ch <- k:
			case <-gctx.Done():
				return gctx.Err()
			}
		}
		return nil
	})
	if uw.Also != nil {
		g.Go(func() error { return uw.Also(gctx) })
	}
	// unit makes unit k on worker, holding core, and writes it (the core
	// given back while another worker's write holds a file).
	unit := func(ctx context.Context, worker, k int, core *cpushare.Hold) error {
		u := units[k]
		data, offs, err := uw.Make(worker, k)
		if err != nil {
			return err
		}
		for o, w := range ws {
			if !writes(o, u.T) {
				continue
			}
			if err := w.WriteAtHolding(ctx, u.T, data[o], offs[o], core); err != nil {
				return err
			}
		}
		if uw.Written != nil {
			uw.Written(worker, k)
		}
		return nil
	}
	for worker := range jobs {
		g.Go(func() error {
			// A core held from the first unit to the last, offered to
			// work of a higher priority between units.
			core, err := uw.Cores.Hold(gctx)
			if err != nil {
				return err
			}
			defer core.Done()
			for k := range ch {
				if err := gctx.Err(); err != nil {
					return err
				}
				if err := core.Yield(gctx); err != nil {
					return err
				}
				if err := unit(gctx, worker, k, core); err != nil {
					return err
				}
				u := units[k]
				for o, w := range ws {
					if !writes(o, u.T) || remaining[o][u.T].Add(-1) != 0 {
						continue
					}
					if err := w.Finish(u.T); err != nil {
						return err
					}
					if uw.Done != nil {
						uw.Done(o, u.T)
					}
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return ctx.Err()
}
