// Package hashfollow hashes files while workers fill them at planned
// places: a reader follows the workers through the page cache in file
// order, hashing each range once every write that lands in it or before
// it is done, so a finished file is not read again for its digest.
//
// The writers' plan is a list of regions in file order, each written by
// one unit of work (a unit may write several regions, as an MLX quantized
// tensor's weight, scales and biases, and a region may be empty).
// Everything not in a region (headers, padding) must be in the file before
// Run starts: Run hashes what lies before the first region at once. Several files are hashed one after
// the other, each with its own hash: positions are offsets into their
// concatenation, as the reader reads them.
package hashfollow

import (
	"context"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
	"sync/atomic"
)

// Follower hashes the files of one plan (see the package comment).
type Follower struct {
	r      io.ReaderAt
	name   func(file int) string
	hs     []hash.Hash // one per file
	ends   []int64     // where each file ends
	start  []int64     // where region i begins
	unit   []int32     // the unit that writes region i
	done   []atomic.Bool
	notify chan struct{}
	size   int64
}

// Region is a range of the files that one unit writes, by where it begins.
type Region struct {
	Start int64
	Unit  int
}

// New follows the files that r reads as one concatenation, file i ending
// at ends[i] (ascending; the last is the total size); name(i) names file
// i in errors. regions are in file order (their starts may not decrease:
// the first out of order is an error) and name units below units.
func New(r io.ReaderAt, ends []int64, regions []Region, units int, name func(file int) string) (*Follower, error) {
	if len(ends) == 0 {
		return nil, fmt.Errorf("hashfollow: no files")
	}
	for i := 1; i < len(ends); i++ {
		if ends[i] < ends[i-1] {
			return nil, fmt.Errorf("%s: internal plan error: file %d ends at %d, before file %d (%d)", name(i), i, ends[i], i-1, ends[i-1])
		}
	}
	f := &Follower{r: r, name: name, ends: ends, start: make([]int64, len(regions)), unit: make([]int32, len(regions)),
		done: make([]atomic.Bool, units), notify: make(chan struct{}, 1), size: ends[len(ends)-1]}
	for i, rg := range regions {
		if i > 0 && rg.Start < regions[i-1].Start {
			return nil, fmt.Errorf("%s: internal plan error: region %d (unit %d) starts at %d, before the region ahead of it (%d)", name(0), i, rg.Unit, rg.Start, regions[i-1].Start)
		}
		if rg.Unit < 0 || rg.Unit >= units {
			return nil, fmt.Errorf("%s: internal plan error: region %d names unit %d of %d", name(0), i, rg.Unit, units)
		}
		f.start[i], f.unit[i] = rg.Start, int32(rg.Unit)
	}
	for range ends {
		f.hs = append(f.hs, sha256.New())
	}
	return f, nil
}

// Written notes that unit k's bytes are in the files (or need not be
// written: work a resumed run kept). Safe from any goroutine; a nil
// follower ignores it.
func (f *Follower) Written(k int) {
	if f == nil {
		return
	}
	f.done[k].Store(true)
	select {
	case f.notify <- struct{}{}:
	default:
	}
}

// Run hashes until every byte of the files is hashed (or ctx ends): it
// runs beside the workers.
func (f *Follower) Run(ctx context.Context) error {
	buf := make([]byte, 1<<20)
	var hashed int64
	file, next := 0, 0
	for hashed < f.size {
		for next < len(f.start) && f.done[f.unit[next]].Load() {
			next++
		}
		safe := f.size
		if next < len(f.start) {
			safe = f.start[next]
		}
		if safe <= hashed {
			select {
			case <-f.notify:
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		}
		for hashed < safe {
			if err := ctx.Err(); err != nil {
				return err
			}
			for hashed >= f.ends[file] {
				file++
			}
			n := min(int64(len(buf)), safe-hashed, f.ends[file]-hashed)
			if _, err := f.r.ReadAt(buf[:n], hashed); err != nil {
				return fmt.Errorf("%s: hashing bytes %d..%d: %w", f.name(file), hashed, hashed+n, err)
			}
			f.hs[file].Write(buf[:n])
			hashed += n
		}
	}
	return nil
}

// Sums are the files' SHA-256 digests, in order, once Run has returned
// nil.
func (f *Follower) Sums() [][]byte {
	out := make([][]byte, len(f.hs))
	for k, h := range f.hs {
		out[k] = h.Sum(nil)
	}
	return out
}
