package gguf

import (
	"context"
	"crypto/sha256"
	"fmt"
	"hash"
	"sync/atomic"
)

// HashFollower hashes the files a Writer is writing in file order while
// its units are written (WriteUnits, WriteUnitsMulti), reading each range
// back from the page cache once every unit before it is in the file, so a
// finished file is not read again for its digest. Units are planned in
// file order, and everything between them (header, padding, tensors a
// resumed run skipped) is in the file before the units are written. The
// parts of a split are hashed one after the other, each with its own
// hash: positions are offsets into their concatenation (Writer.ReadAt).
type HashFollower struct {
	w      *Writer
	hs     []hash.Hash // one per file
	ends   []int64     // where each file ends
	start  []int64     // where unit k begins
	done   []atomic.Bool
	notify chan struct{}
	size   int64
}

// NewHashFollower follows w, whose unit k's bytes begin at start[k] (in
// the concatenation ReadAt reads). The starts may not decrease: units
// out of file order are an error (names the first).
func NewHashFollower(w *Writer, start []int64) (*HashFollower, error) {
	ends := w.FileBounds()
	for k := 1; k < len(start); k++ {
		if start[k] < start[k-1] {
			return nil, fmt.Errorf("%s: internal plan error: unit %d starts at %d, before the unit ahead of it (%d)", w.Path(), k, start[k], start[k-1])
		}
	}
	hf := &HashFollower{w: w, ends: ends, start: start, done: make([]atomic.Bool, len(start)),
		notify: make(chan struct{}, 1), size: ends[len(ends)-1]}
	for range ends {
		hf.hs = append(hf.hs, sha256.New())
	}
	return hf, nil
}

// Written notes that unit k's bytes are in the file (or need not be
// written: a tensor a resumed run kept). A nil follower ignores it.
func (hf *HashFollower) Written(k int) {
	if hf == nil {
		return
	}
	hf.done[k].Store(true)
	select {
	case hf.notify <- struct{}{}:
	default:
	}
}

// Run hashes until every byte of the files is hashed (or ctx ends): it
// runs beside the workers (UnitWork.Also).
func (hf *HashFollower) Run(ctx context.Context) error {
	buf := make([]byte, 1<<20)
	var hashed int64
	file, next := 0, 0
	for hashed < hf.size {
		for next < len(hf.done) && hf.done[next].Load() {
			next++
		}
		safe := hf.size
		if next < len(hf.start) {
			safe = hf.start[next]
		}
		if safe <= hashed {
			select {
			case <-hf.notify:
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		}
		for hashed < safe {
			if err := ctx.Err(); err != nil {
				return err
			}
			for hashed >= hf.ends[file] {
				file++
			}
			n := min(int64(len(buf)), safe-hashed, hf.ends[file]-hashed)
			if _, err := hf.w.ReadAt(buf[:n], hashed); err != nil {
				return fmt.Errorf("%s: hashing bytes %d..%d: %w", hf.w.Paths()[file], hashed, hashed+n, err)
			}
			hf.hs[file].Write(buf[:n])
			hashed += n
		}
	}
	return nil
}

// Sums are the files' SHA-256 digests (Layout.Files' order), once Run
// has returned nil.
func (hf *HashFollower) Sums() [][]byte {
	out := make([][]byte, len(hf.hs))
	for k, h := range hf.hs {
		out[k] = h.Sum(nil)
	}
	return out
}
