// Package hashing computes sha256 digests of byte ranges of files (tensors,
// shards) in parallel with bounded memory: each worker reads its range
// through ReadAt (pread) in fixed-size chunks into one reused buffer, so
// peak memory is about jobs × ChunkSize whatever the file sizes, and the
// page cache, not the process, holds the file data.
package hashing

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"sort"

	"golang.org/x/sync/errgroup"
)

// ChunkSize is the read size per worker.
const ChunkSize = 1 << 20

// Section is a byte range to hash; *io.SectionReader implements it.
type Section interface {
	io.ReaderAt
	Size() int64
}

// SectionError reports a failed read: which section (its index in the
// slice given to Sections) and the byte offset within it, so a caller can
// name the file, tensor and absolute offset.
type SectionError struct {
	Index  int
	Offset int64 // relative to the section's start
	Err    error
}

func (e *SectionError) Error() string {
	return fmt.Sprintf("section %d: reading at offset %d: %v", e.Index, e.Offset, e.Err)
}

func (e *SectionError) Unwrap() error { return e.Err }

// Digest is a sha256.
type Digest [sha256.Size]byte

// Sections returns the sha256 of each section, in order, using up to jobs
// workers (jobs < 1 means 1). Larger sections are started first so one big
// tensor does not finish alone at the end. progress, if not nil, is called
// with each chunk's byte count from the worker goroutines and must be safe
// for concurrent use. The result does not depend on jobs.
func Sections(ctx context.Context, secs []Section, jobs int, progress func(n int64)) ([]Digest, error) {
	if jobs < 1 {
		jobs = 1
	}
	order := make([]int, len(secs))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return secs[order[a]].Size() > secs[order[b]].Size() })

	out := make([]Digest, len(secs))
	work := make(chan int)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(work)
		for _, i := range order {
			select {
			case work <- i:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	for range min(jobs, max(len(secs), 1)) {
		g.Go(func() error {
			buf := make([]byte, ChunkSize)
			for i := range work {
				d, err := hashOne(ctx, secs[i], buf, progress)
				if err != nil {
					if se, ok := err.(*SectionError); ok {
						se.Index = i
					}
					return err
				}
				out[i] = d
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return out, nil
}

func hashOne(ctx context.Context, s Section, buf []byte, progress func(int64)) (Digest, error) {
	h := sha256.New()
	size := s.Size()
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return Digest{}, err
		}
		n := int(min(int64(len(buf)), size-off))
		m, err := s.ReadAt(buf[:n], off)
		if m < n {
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return Digest{}, &SectionError{Offset: off + int64(m), Err: err}
		}
		h.Write(buf[:n])
		off += int64(n)
		if progress != nil {
			progress(int64(n))
		}
	}
	var d Digest
	h.Sum(d[:0])
	return d, nil
}
