package mlxpack

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/modulepaths"
	"github.com/ferry-llm/ferry/safetensors"
)

// The shard writer mlx repack (--rewrite) and mlx quantize share: an
// output shard's layout is made at plan time (outShard: header bytes,
// tensor offsets, size); a shardFile writes it, as one stream in tensor
// order (repack) or at planned offsets from many workers (quantize), with
// background writeback (fsutil.Writeback) and a final fsync; holdsShard and
// resumeShard check an existing file against the layout (repack's
// unchanged shard, quantize's resume). splitShards names and splits shards
// as mlx-lm saves them, and indexJSON writes the index of either.

// outShard is one output safetensors file as planned: nothing in it
// depends on the tensor data.
type outShard struct {
	name  string
	specs []safetensors.TensorSpec
	hdr   []byte // length prefix, JSON header and padding
	infos []safetensors.TensorInfo
	size  int64 // the whole file
}

// layoutShard lays specs out, in order, under the given header metadata.
func layoutShard(name string, metadata map[string]string, specs []safetensors.TensorSpec) (outShard, error) {
	hdr, infos, err := safetensors.EncodeHeader(metadata, specs)
	if err != nil {
		return outShard{}, err
	}
	s := outShard{name: name, specs: specs, hdr: hdr, infos: infos, size: int64(len(hdr))}
	if n := len(infos); n > 0 {
		s.size += infos[n-1].End
	}
	return s, nil
}

// mlxShardMetadata is the header metadata mlx-lm's save_model writes.
var mlxShardMetadata = map[string]string{"format": "mlx"}

// splitShards splits specs, in order, as mlx-lm's make_shards does (a new
// shard when the next tensor would take the current one over limit, so a
// first tensor over the limit leaves an empty first shard, as there) and
// names them as save_model does: model.safetensors alone, else
// model-0000i-of-0000n.safetensors.
func splitShards(specs []safetensors.TensorSpec, limit int64) ([]outShard, error) {
	return splitShardsAs(specs, limit, safetensors.ShardName, safetensors.SingleName)
}

// splitMTPShards splits a kept MTP head's specs the same way into its side
// files: mtp.safetensors alone, else mtp-0000i-of-0000n.safetensors
// (modulepaths.MTPSideFile: names mlx-lm's model*.safetensors glob does
// not match).
func splitMTPShards(specs []safetensors.TensorSpec, limit int64) ([]outShard, error) {
	return splitShardsAs(specs, limit, func(i, n int) string {
		return fmt.Sprintf("%s-%05d-of-%05d.safetensors", modulepaths.MTPSideStem, i, n)
	}, modulepaths.MTPSideFile)
}

func splitShardsAs(specs []safetensors.TensorSpec, limit int64, shardName func(i, n int) string, single string) ([]outShard, error) {
	var groups [][]safetensors.TensorSpec
	var cur []safetensors.TensorSpec
	var size int64
	for _, s := range specs {
		if size+s.Size() > limit {
			groups = append(groups, cur)
			cur, size = nil, 0
		}
		cur = append(cur, s)
		size += s.Size()
	}
	groups = append(groups, cur)
	out := make([]outShard, len(groups))
	for i, g := range groups {
		name := single
		if len(groups) > 1 {
			name = shardName(i+1, len(groups))
		}
		var err error
		if out[i], err = layoutShard(name, mlxShardMetadata, g); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return out, nil
}

// indexJSON encodes model.safetensors.index.json. mlx-lm's save_model
// writes it with json.dump(indent=4) (mlxStyle): metadata first, its keys
// total_size then total_parameters as the dict is built, weight_map
// sorted, no final newline. An index kept from a Hugging Face checkpoint
// is written as json.dumps(indent=2, sort_keys=True) plus a newline.
func indexJSON(metadata map[string]any, weightMap map[string]string, mlxStyle bool) ([]byte, error) {
	if mlxStyle {
		wm := make(map[string]any, len(weightMap))
		for k, v := range weightMap {
			wm[k] = v
		}
		order := &keyOrder{keys: []string{"metadata", "weight_map"},
			sub: map[string]*keyOrder{"metadata": {keys: []string{"total_size", "total_parameters"}}}}
		return pyJSON(map[string]any{"metadata": metadata, "weight_map": wm}, order, false)
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(map[string]any{"metadata": metadata, "weight_map": weightMap}); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// shardFile is an output shard open for writing: header written, file at
// its planned size, writeback running. Bodies go in as one stream in
// tensor order (Write) or at planned offsets (writeTensorAt, from any
// goroutine); Close makes the file durable, Abort stops.
type shardFile struct {
	sh       *outShard
	path     string // the shard's final path, for messages
	f        *os.File
	af       *fsutil.AtomicFile // set when the file replaces path at Close
	wb       *fsutil.Writeback
	pos      int64 // Write's next offset
	streamed bool  // filled by Write: Close checks every byte came
}

// createShard makes path afresh, in place: for a directory that is itself
// renamed into place when complete (mlx quantize's partial directory).
func createShard(path string, sh *outShard) (*shardFile, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	return startShard(path, sh, f, nil)
}

// replaceShard writes path under a temp name beside it, renamed over path
// by Close: for a directory already in use (mlx repack's destination).
func replaceShard(path string, sh *outShard) (*shardFile, error) {
	af, err := fsutil.CreateAtomic(path)
	if err != nil {
		return nil, err
	}
	return startShard(path, sh, af.File, af)
}

func startShard(path string, sh *outShard, f *os.File, af *fsutil.AtomicFile) (*shardFile, error) {
	w := &shardFile{sh: sh, path: path, f: f, af: af, pos: int64(len(sh.hdr))}
	err := f.Truncate(sh.size)
	if err == nil {
		_, err = f.WriteAt(sh.hdr, 0)
	}
	if err != nil {
		w.Abort()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	w.wb = fsutil.NewWriteback(f)
	return w, nil
}

// resumeShard reopens path, made by createShard in an interrupted run; it
// must have the planned size and header (what its bodies hold is the
// caller's journal's business).
func resumeShard(path string, sh *outShard) (*shardFile, error) {
	return reopenShard(path, sh, os.O_RDWR)
}

// readShard is resumeShard for a shard that is whole: opened to be read
// (hashed) only.
func readShard(path string, sh *outShard) (*shardFile, error) {
	return reopenShard(path, sh, os.O_RDONLY)
}

func reopenShard(path string, sh *outShard, flag int) (*shardFile, error) {
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, err
	}
	if err := matchLayout(f, sh); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &shardFile{sh: sh, path: path, f: f, pos: int64(len(sh.hdr)), wb: fsutil.NewWriteback(f)}, nil
}

// matchLayout checks that f has sh's size and header.
func matchLayout(f *os.File, sh *outShard) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() != sh.size {
		return fmt.Errorf("size %d, want %d", st.Size(), sh.size)
	}
	hdr := make([]byte, len(sh.hdr))
	if _, err := f.ReadAt(hdr, 0); err != nil || !bytes.Equal(hdr, sh.hdr) {
		return errors.New("header differs from the plan")
	}
	return nil
}

// Write appends body bytes in tensor order after those written so far;
// bytes past the planned size are refused.
func (w *shardFile) Write(p []byte) (int, error) {
	w.streamed = true
	if int64(len(p)) > w.sh.size-w.pos {
		return 0, fmt.Errorf("%s: %w: %d bytes past the last tensor", w.path, safetensors.ErrWriteSize, int64(len(p))-(w.sh.size-w.pos))
	}
	n, err := w.f.WriteAt(p, w.pos)
	w.pos += int64(n)
	w.wb.Wrote(int64(n))
	if err != nil {
		return n, fmt.Errorf("%s: %w", w.path, err)
	}
	return n, nil
}

// writeTensorAt writes data at offset off of tensor i's body. Safe from
// several goroutines at once (distinct ranges).
func (w *shardFile) writeTensorAt(i int, off int64, data []byte) error {
	t := w.sh.infos[i]
	if off < 0 || off+int64(len(data)) > t.Size() {
		return fmt.Errorf("%s: tensor %q: %w: %d bytes at %d of %d", w.path, t.Name, safetensors.ErrWriteSize, len(data), off, t.Size())
	}
	if _, err := w.f.WriteAt(data, int64(len(w.sh.hdr))+t.Begin+off); err != nil {
		return fmt.Errorf("%s: %w", w.path, err)
	}
	w.wb.Wrote(int64(len(data)))
	return nil
}

// Sync makes what is written so far durable.
func (w *shardFile) Sync() error { return w.f.Sync() }

// Close stops writeback, checks that a streamed shard got every byte,
// fsyncs and closes; a replacing shard is then renamed over its path and
// the directory synced. On error a replacing shard's temp file is gone.
func (w *shardFile) Close() error {
	w.wb.Stop()
	if w.streamed && w.pos != w.sh.size {
		w.Abort()
		return fmt.Errorf("%s: %w: %d of %d bytes written", w.path, safetensors.ErrWriteSize, w.pos, w.sh.size)
	}
	if w.af != nil {
		return w.af.Commit()
	}
	if err := w.f.Sync(); err != nil {
		w.f.Close()
		return err
	}
	return w.f.Close()
}

// Abort stops writing: a replacing shard's temp file is removed, an
// in-place one is closed as it is (a resume finds what is durable).
func (w *shardFile) Abort() {
	w.wb.Stop()
	if w.af != nil {
		w.af.Abort()
		return
	}
	w.f.Close()
}

// holdsShard reports whether the file at path holds exactly the shard sh
// whose bodies fill streams, in order: size and header first, then every
// body byte compared as fill makes it (nothing written, nothing held
// whole).
func holdsShard(path string, sh *outShard, fill func(io.Writer) error) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	if matchLayout(f, sh) != nil {
		return false, nil
	}
	bw := bufio.NewWriterSize(&compareWriter{r: f, off: int64(len(sh.hdr))}, chunk)
	err = fill(bw)
	if err == nil {
		err = bw.Flush()
	}
	if errors.Is(err, errDiffers) {
		return false, nil
	}
	return err == nil, err
}

var errDiffers = errors.New("differs")

// compareWriter checks written bytes against r from offset off.
type compareWriter struct {
	r   io.ReaderAt
	off int64
	buf []byte
}

func (c *compareWriter) Write(p []byte) (int, error) {
	if cap(c.buf) < len(p) {
		c.buf = make([]byte, len(p))
	}
	b := c.buf[:len(p)]
	if _, err := c.r.ReadAt(b, c.off); err != nil || !bytes.Equal(b, p) {
		return 0, errDiffers
	}
	c.off += int64(len(p))
	return len(p), nil
}
