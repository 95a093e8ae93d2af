package verify

import (
	"errors"
	"io"
	"io/fs"
	"os"

	"github.com/ferry-llm/ferry/internal/inputerr"
)

// MTP checks the MTP head of the artifact at path: a GGUF file, a
// safetensors checkpoint directory (sharded with an index, or a single
// model.safetensors; naming the index or a shard means its directory), or an
// MLX directory. A verdict is not an error: err is non-nil only when path
// cannot be checked at all (not a model, a truncated header, an unreadable
// index), and such errors implement BadInput.
func MTP(path string, opts Options) (*Report, error) {
	fi, err := os.Stat(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is already in Error
		}
		return nil, inputerr.Wrap(path, err)
	}
	if fi.IsDir() {
		return verifyCheckpoint(path, fi, opts)
	}
	if !fi.Mode().IsRegular() {
		return nil, badf(path, ErrNotModel, "not a regular file or directory")
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil, inputerr.Wrap(path, err)
	}
	defer fh.Close()
	var magic [4]byte
	if _, err := fh.ReadAt(magic[:], 0); err != nil && err != io.EOF {
		return nil, inputerr.Wrap(path, err)
	}
	if string(magic[:]) == "GGUF" {
		return GGUF(fh, fi.Size(), path, opts)
	}
	return verifyCheckpoint(path, fi, opts)
}
