package hashing

import (
	"context"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
)

// Hex is the digest in lower-case hex.
func (d Digest) Hex() string { return hex.EncodeToString(d[:]) }

// Writer passes writes through to an underlying writer and hashes exactly
// the bytes it accepted, so the digest always names what the destination
// holds. Its state can be saved at a unit boundary (State) and a Writer
// resumed from it (Resume), so a restarted write continues the digest
// without reading the bytes before the boundary again.
type Writer struct {
	w io.Writer
	h hash.Hash
	n int64
}

// NewWriter hashes what is written through it to w; w may be nil to hash
// only.
func NewWriter(w io.Writer) *Writer {
	if w == nil {
		w = io.Discard
	}
	return &Writer{w: w, h: sha256.New()}
}

// ErrBadState reports a saved state that does not restore.
var ErrBadState = errors.New("hashing: bad saved state")

// Resume continues a write whose State was saved after size bytes: the
// next byte written to w is byte size of the stream.
func Resume(w io.Writer, state []byte, size int64) (*Writer, error) {
	if size < 0 {
		return nil, ErrBadState
	}
	hw := NewWriter(w)
	if err := hw.h.(encoding.BinaryUnmarshaler).UnmarshalBinary(state); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadState, err)
	}
	hw.n = size
	return hw, nil
}

func (w *Writer) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	w.h.Write(p[:n])
	w.n += int64(n)
	return n, err
}

// Size is the number of bytes hashed.
func (w *Writer) Size() int64 { return w.n }

// Sum is the digest of everything hashed so far.
func (w *Writer) Sum() Digest {
	var d Digest
	w.h.Sum(d[:0])
	return d
}

// State is the marshaled sha256 state (crypto/sha256 implements
// encoding.BinaryMarshaler), for Resume with Size.
func (w *Writer) State() []byte {
	st, err := w.h.(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil {
		panic(err) // crypto/sha256 always marshals
	}
	return st
}

// File hashes the file at path in ChunkSize reads, reporting each chunk's
// byte count to progress (if not nil) and stopping when ctx is done.
func File(ctx context.Context, path string, progress func(n int64)) (Digest, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return Digest{}, 0, err
	}
	defer f.Close()
	w := NewWriter(nil)
	// A buffer no larger than the file (and the EOF read after it): a
	// tree of small files must not cost a ChunkSize allocation each.
	n := int64(ChunkSize)
	if fi, err := f.Stat(); err == nil && fi.Size() < n {
		n = max(fi.Size()+1, 4096)
	}
	buf := make([]byte, n)
	for {
		if err := ctx.Err(); err != nil {
			return Digest{}, 0, err
		}
		k, err := f.Read(buf)
		w.Write(buf[:k])
		if progress != nil && k > 0 {
			progress(int64(k))
		}
		if err == io.EOF {
			return w.Sum(), w.Size(), nil
		}
		if err != nil {
			return Digest{}, 0, fmt.Errorf("%s: %w", path, err)
		}
	}
}
