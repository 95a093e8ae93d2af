package fsutil

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/ferry-llm/ferry/internal/hashing"
)

// CopyAtomic copies src to dst through an AtomicFile, hashing the bytes as
// they are written, and returns their digest and count. progress, if not
// nil, gets each chunk's byte count. On error (ctx done included) dst is
// untouched and no temp file is left.
func CopyAtomic(ctx context.Context, dst, src string, progress func(n int64)) (hashing.Digest, int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return hashing.Digest{}, 0, err
	}
	defer in.Close()
	af, err := CreateAtomic(dst)
	if err != nil {
		return hashing.Digest{}, 0, err
	}
	hw := hashing.NewWriter(af)
	buf := make([]byte, hashing.ChunkSize)
	for {
		if err := ctx.Err(); err != nil {
			af.Abort()
			return hashing.Digest{}, 0, err
		}
		n, rerr := in.Read(buf)
		if n > 0 {
			if _, err := hw.Write(buf[:n]); err != nil {
				af.Abort()
				return hashing.Digest{}, 0, fmt.Errorf("%s: %w", dst, err)
			}
			if progress != nil {
				progress(int64(n))
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			af.Abort()
			return hashing.Digest{}, 0, fmt.Errorf("%s: %w", src, rerr)
		}
	}
	if err := af.Commit(); err != nil {
		return hashing.Digest{}, 0, err
	}
	return hw.Sum(), hw.Size(), nil
}
