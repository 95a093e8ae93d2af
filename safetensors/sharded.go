package safetensors

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/jsonout"
)

// PlanShards splits specs, in order, into shards the way huggingface_hub's
// split_state_dict_into_shards_factory does: greedily, starting a new shard
// when the next tensor would push the current one over maxSize. A tensor
// larger than maxSize gets a shard of its own, appended at once, while the
// shard being filled stays open for the tensors after it — so an oversized
// tensor's shard comes before the shard of the smaller tensors around it.
func PlanShards(specs []TensorSpec, maxSize int64) [][]TensorSpec {
	var out [][]TensorSpec
	var cur []TensorSpec
	var curSize int64
	for _, s := range specs {
		sz := s.Size()
		if sz > maxSize {
			out = append(out, []TensorSpec{s})
			continue
		}
		if len(cur) > 0 && curSize+sz > maxSize {
			out = append(out, cur)
			cur, curSize = nil, 0
		}
		cur = append(cur, s)
		curSize += sz
	}
	if len(cur) > 0 || len(out) == 0 {
		out = append(out, cur)
	}
	return out
}

// ShardFile is one planned output file.
type ShardFile struct {
	Name    string
	Tensors []TensorSpec
}

// WriteIndex writes model.safetensors.index.json atomically, formatted like
// json.dumps(indent=2, sort_keys=True) plus a newline. extra metadata keys
// (e.g. total_parameters) are added beside total_size.
func WriteIndex(dir string, weightMap map[string]string, totalSize int64, extra map[string]any) error {
	md := map[string]any{"total_size": totalSize}
	for k, v := range extra {
		md[k] = v
	}
	var b bytes.Buffer
	if err := jsonout.Write(&b, map[string]any{"metadata": md, "weight_map": weightMap}); err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(filepath.Join(dir, IndexName), b.Bytes(), 0o644)
}

// ShardedWriter writes a sharded checkpoint into a directory: shard files
// one after another, each atomic, then the index last. A single shard is
// written as model.safetensors with no index, as huggingface_hub does.
type ShardedWriter struct {
	dir      string
	metadata map[string]string
	files    []ShardFile
	extra    map[string]any
	cur      int
	w        *Writer
	err      error
}

// CreateSharded plans the shards and opens the first. extra is added to the
// index metadata.
func CreateSharded(dir string, metadata map[string]string, specs []TensorSpec, maxShardSize int64, extra map[string]any) (*ShardedWriter, error) {
	plan := PlanShards(specs, maxShardSize)
	files := make([]ShardFile, len(plan))
	for i, p := range plan {
		name := SingleName
		if len(plan) > 1 {
			name = ShardName(i+1, len(plan))
		}
		files[i] = ShardFile{Name: name, Tensors: p}
	}
	return CreateShardedFiles(dir, metadata, files, extra)
}

// CreateShardedFiles writes an explicit shard layout (for keeping a base
// checkpoint's file names and tensor assignment).
func CreateShardedFiles(dir string, metadata map[string]string, files []ShardFile, extra map[string]any) (*ShardedWriter, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	sw := &ShardedWriter{dir: dir, metadata: metadata, files: files, extra: extra}
	seen := map[string]bool{}
	for _, f := range files {
		if err := checkPlainName(f.Name); err != nil {
			return nil, fmt.Errorf("shard %q: %w", f.Name, err)
		}
		for _, t := range f.Tensors {
			if seen[t.Name] {
				return nil, fmt.Errorf("tensor %q: %w", t.Name, ErrDuplicateTensor)
			}
			seen[t.Name] = true
		}
	}
	if err := sw.open(); err != nil {
		return nil, err
	}
	return sw, nil
}

// Files is the planned layout.
func (sw *ShardedWriter) Files() []ShardFile { return sw.files }

func (sw *ShardedWriter) open() error {
	w, err := Create(filepath.Join(sw.dir, sw.files[sw.cur].Name), sw.metadata, sw.files[sw.cur].Tensors)
	if err != nil {
		sw.err = err
		return err
	}
	sw.w = w
	return nil
}

// advance commits finished shards and opens the next, until the current
// shard is the one that holds name (or the last).
func (sw *ShardedWriter) advance(name string) error {
	for sw.cur < len(sw.files)-1 && sw.w.Done() && (name == "" || !hasTensor(sw.files[sw.cur], name)) {
		if err := sw.w.Close(); err != nil {
			sw.err = err
			return err
		}
		sw.cur++
		if err := sw.open(); err != nil {
			return err
		}
	}
	return nil
}

func hasTensor(f ShardFile, name string) bool {
	for _, t := range f.Tensors {
		if t.Name == name {
			return true
		}
	}
	return false
}

// WriteTensor writes the named tensor, which must be next in plan order.
func (sw *ShardedWriter) WriteTensor(name string, r io.Reader) error {
	if sw.err != nil {
		return sw.err
	}
	if err := sw.advance(name); err != nil {
		return err
	}
	if err := sw.w.WriteTensor(name, r); err != nil {
		sw.err = err
		return err
	}
	return nil
}

// Close commits the last shard and writes the index.
func (sw *ShardedWriter) Close() error {
	if sw.err != nil {
		sw.Abort()
		return sw.err
	}
	if err := sw.advance(""); err != nil {
		sw.Abort()
		return err
	}
	if err := sw.w.Close(); err != nil {
		sw.err = err
		return err
	}
	sw.err = fmt.Errorf("%s: sharded writer closed", sw.dir)
	if len(sw.files) == 1 && sw.files[0].Name == SingleName {
		return nil
	}
	wm := map[string]string{}
	var total int64
	for _, f := range sw.files {
		for _, t := range f.Tensors {
			wm[t.Name] = f.Name
			total += t.Size()
		}
	}
	return WriteIndex(sw.dir, wm, total, sw.extra)
}

// Abort discards the shard being written. Shards already committed stay;
// without an index they do not form a checkpoint.
func (sw *ShardedWriter) Abort() {
	if sw.w != nil {
		sw.w.Abort()
	}
	if sw.err == nil {
		sw.err = fmt.Errorf("%s: sharded writer aborted", sw.dir)
	}
}
