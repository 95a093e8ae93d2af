package safetensors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/ferry-llm/ferry/internal/fsutil"
)

// IndexName is the conventional index file of a sharded checkpoint.
const IndexName = "model.safetensors.index.json"

// SingleName is the conventional single-file checkpoint.
const SingleName = "model.safetensors"

var shardRE = regexp.MustCompile(`^model-(\d{5})-of-(\d{5})\.safetensors$`)

// ShardName is the Hugging Face shard file name, 1-based.
func ShardName(i, n int) string { return fmt.Sprintf("model-%05d-of-%05d.safetensors", i, n) }

// Index is a parsed model.safetensors.index.json.
type Index struct {
	Metadata  map[string]any
	WeightMap map[string]string
}

// maxIndexSize bounds what ReadIndex loads: a 1M-tensor weight map is a few
// tens of MB.
const maxIndexSize = 256 << 20

// ReadIndex parses an index file, rejecting duplicate weight_map keys (which
// Python's json would silently collapse) and non-string values.
func ReadIndex(path string) (*Index, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > maxIndexSize {
		return nil, errf(path, "", -1, ErrInvalidIndex, "%d bytes is over the %d-byte limit", st.Size(), maxIndexSize)
	}
	data, err := io.ReadAll(fh)
	if err != nil {
		return nil, err
	}
	return ParseIndex(data, path)
}

// ParseIndex parses index JSON; path is used in errors.
func ParseIndex(data []byte, path string) (*Index, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	bad := func(format string, args ...any) error {
		return errf(path, "", dec.InputOffset(), ErrInvalidIndex, format, args...)
	}
	expect := func(want json.Delim) error {
		tok, err := dec.Token()
		if err != nil {
			return bad("%v", err)
		}
		if d, ok := tok.(json.Delim); !ok || d != want {
			return bad("expected %q, found %v", string(want), tok)
		}
		return nil
	}
	if err := expect('{'); err != nil {
		return nil, err
	}
	idx := &Index{}
	seenTop := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, bad("%v", err)
		}
		key := tok.(string)
		if seenTop[key] {
			return nil, bad("key %q appears twice", key)
		}
		seenTop[key] = true
		switch key {
		case "metadata":
			if err := dec.Decode(&idx.Metadata); err != nil {
				return nil, bad("metadata: %v", err)
			}
		case "weight_map":
			if err := expect('{'); err != nil {
				return nil, err
			}
			idx.WeightMap = map[string]string{}
			for dec.More() {
				tok, err := dec.Token()
				if err != nil {
					return nil, bad("%v", err)
				}
				name := tok.(string)
				var file *string // null would decode into a string as ""
				if err := dec.Decode(&file); err != nil || file == nil {
					if err == nil {
						err = errors.New("null")
					}
					return nil, errf(path, name, dec.InputOffset(), ErrInvalidIndex, "weight_map value must be a file name: %v", err)
				}
				if _, dup := idx.WeightMap[name]; dup {
					return nil, errf(path, name, dec.InputOffset(), ErrInvalidIndex, "appears twice in weight_map")
				}
				idx.WeightMap[name] = *file
			}
			if err := expect('}'); err != nil {
				return nil, err
			}
		default:
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return nil, bad("%v", err)
			}
		}
	}
	if err := expect('}'); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, bad("data after the index object")
	}
	if idx.WeightMap == nil {
		return nil, bad("no weight_map")
	}
	return idx, nil
}

// Location is where a tensor lives in a checkpoint.
type Location struct {
	Shard *Shard
	Info  TensorInfo
}

// Shard is one safetensors file of a checkpoint.
type Shard struct {
	Name string // file name within the directory
	*File
}

// Section returns a reader over the tensor's bytes.
func (l Location) Section() *io.SectionReader { return l.Shard.Section(l.Info) }

// Checkpoint is a validated Hugging Face safetensors checkpoint directory.
type Checkpoint struct {
	Dir       string
	IndexPath string // "" for a single-file checkpoint
	Index     *Index // nil for a single-file checkpoint
	Shards    []*Shard
	Config    *Config // nil when the directory has no config.json

	byName map[string]Location
	order  []Location
}

// DirOptions tune OpenDir.
type DirOptions struct {
	// FollowExternalLinks accepts files that are symlinks resolving outside
	// the directory. By default only links into a content-addressed store
	// (a "blobs" directory, as the Hugging Face cache and ferry's store use)
	// are accepted; see internal/fsutil's link policy.
	FollowExternalLinks bool
}

// OpenDir opens dir with default options.
func OpenDir(dir string) (*Checkpoint, error) { return OpenDirOptions(dir, DirOptions{}) }

// OpenDirOptions opens and checks a checkpoint directory before anything
// else touches it: every indexed tensor exists in the shard the index
// names, no tensor is in two shards, no conventionally named shard sits
// outside the index, and every shard is a plain file name inside dir.
func OpenDirOptions(dir string, opt DirOptions) (c *Checkpoint, err error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, errf(dir, "", -1, ErrNotCheckpoint, "not a directory")
	}
	c = &Checkpoint{Dir: dir, byName: map[string]Location{}}
	opened := c // c is nil on the error returns; close what was opened
	defer func() {
		if err != nil {
			opened.Close()
		}
	}()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var onDisk []string
	for _, e := range entries {
		if shardRE.MatchString(e.Name()) || e.Name() == SingleName {
			onDisk = append(onDisk, e.Name())
		}
	}
	if len(onDisk) > 0 || fileExists(filepath.Join(dir, IndexName)) {
		// Before anything is read (what is not a checkpoint at all is
		// reported as such below, without walking it).
		if err := checkLinks(dir, opt); err != nil {
			return nil, err
		}
	}
	if cfgPath := filepath.Join(dir, "config.json"); fileExists(cfgPath) {
		if c.Config, err = ReadConfig(cfgPath); err != nil {
			return nil, err
		}
	}

	idxPath := filepath.Join(dir, IndexName)
	if !fileExists(idxPath) {
		// A single file, or one unindexed shard set of exactly one file.
		switch {
		case len(onDisk) == 1 && onDisk[0] == SingleName:
		case len(onDisk) == 0:
			return nil, errf(dir, "", -1, ErrNotCheckpoint, "no %s and no %s", SingleName, IndexName)
		default:
			return nil, errf(dir, "", -1, ErrInvalidIndex, "%d shard files but no %s", len(onDisk), IndexName)
		}
		sh, err := c.openShard(SingleName, opt)
		if err != nil {
			return nil, err
		}
		for _, t := range sh.Tensors {
			c.add(Location{Shard: sh, Info: t})
		}
		return c, nil
	}

	c.IndexPath = idxPath
	if c.Index, err = ReadIndex(idxPath); err != nil {
		return nil, err
	}
	// Tensor and shard names in a stable order, so the first error reported
	// is the same on every run.
	indexed := make([]string, 0, len(c.Index.WeightMap))
	for name := range c.Index.WeightMap {
		indexed = append(indexed, name)
	}
	sort.Strings(indexed)
	files := map[string]bool{}
	for _, name := range indexed {
		file := c.Index.WeightMap[name]
		if err := checkPlainName(file); err != nil {
			return nil, errf(idxPath, name, -1, ErrOutsideDir, "weight_map names %q: %v", file, err)
		}
		files[file] = true
	}
	names := make([]string, 0, len(files))
	for f := range files {
		names = append(names, f)
	}
	sort.Strings(names)
	for _, f := range onDisk {
		if !files[f] {
			return nil, errf(filepath.Join(dir, f), "", -1, ErrStrayShard, "%s does not list it", IndexName)
		}
	}
	if err := checkShardCount(idxPath, names); err != nil {
		return nil, err
	}
	shardOf := map[string]*Shard{}
	for _, f := range names {
		sh, err := c.openShard(f, opt)
		if err != nil {
			return nil, err
		}
		shardOf[f] = sh
	}
	// Every tensor in exactly one shard, the one the index names.
	where := map[string]*Shard{}
	for _, sh := range c.Shards {
		for _, t := range sh.Tensors {
			if prev, ok := where[t.Name]; ok {
				return nil, errf(sh.Path, t.Name, sh.DataOffset()+t.Begin, ErrTensorTwice, "also in %s", prev.Name)
			}
			where[t.Name] = sh
		}
	}
	for _, sh := range c.Shards {
		for _, t := range sh.Tensors {
			if _, ok := c.Index.WeightMap[t.Name]; !ok {
				return nil, errf(sh.Path, t.Name, sh.DataOffset()+t.Begin, ErrUnindexedTensor, "%s does not list it", IndexName)
			}
		}
	}
	for _, name := range indexed {
		file := c.Index.WeightMap[name]
		sh, ok := where[name]
		if !ok {
			return nil, errf(filepath.Join(dir, file), name, -1, ErrMissingTensor, "%s puts it in this shard, but no shard has it", IndexName)
		}
		if sh.Name != file {
			return nil, errf(filepath.Join(dir, file), name, -1, ErrMissingTensor, "%s puts it in this shard, but it is in %s", IndexName, sh.Name)
		}
	}
	for _, sh := range c.Shards {
		for _, t := range sh.Tensors {
			c.add(Location{Shard: sh, Info: t})
		}
	}
	return c, nil
}

// checkShardCount catches a shard set whose "-of-N" count and the index
// disagree (a shard both absent from disk and from the index).
func checkShardCount(idxPath string, names []string) error {
	total := -1
	seen := map[int]bool{}
	for _, n := range names {
		m := shardRE.FindStringSubmatch(n)
		if m == nil {
			return nil // not the conventional naming; nothing to check
		}
		i, _ := strconv.Atoi(m[1])
		of, _ := strconv.Atoi(m[2])
		if total == -1 {
			total = of
		} else if of != total {
			return errf(idxPath, "", -1, ErrInvalidIndex, "shards %s disagree on the shard count", strings.Join(names, ", "))
		}
		seen[i] = true
	}
	for i := 1; i <= total; i++ {
		if !seen[i] {
			return errf(idxPath, "", -1, ErrMissingShard, "%s is not in the index (the shards say there are %d)", ShardName(i, total), total)
		}
	}
	return nil
}

func (c *Checkpoint) add(l Location) {
	c.byName[l.Info.Name] = l
	c.order = append(c.order, l)
}

func (c *Checkpoint) openShard(name string, opt DirOptions) (*Shard, error) {
	p := filepath.Join(c.Dir, name)
	f, err := Open(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, errf(p, "", -1, ErrMissingShard, "%s names it but it does not exist", IndexName)
		}
		return nil, err
	}
	sh := &Shard{Name: name, File: f}
	c.Shards = append(c.Shards, sh)
	return sh, nil
}

func checkPlainName(file string) error {
	switch {
	case file == "", file == ".", file == "..":
		return errors.New("not a file name")
	case filepath.IsAbs(file) || strings.HasPrefix(file, "/"):
		return errors.New("absolute path")
	case strings.ContainsAny(file, `/\`):
		return errors.New("a path, not a plain file name")
	case strings.ContainsRune(file, 0):
		return errors.New("NUL in name")
	}
	return nil
}

// checkLinks applies ferry's symlink policy (internal/fsutil: links that
// resolve outside the directory are refused, links into the Hugging Face
// cache's or a ferry store's blobs are not) to every file of dir, as the
// checkpoint's bad-input error.
func checkLinks(dir string, opt DirOptions) error {
	if opt.FollowExternalLinks {
		return nil
	}
	err := fsutil.CheckLinks(dir)
	var le *fsutil.LinkError
	if errors.As(err, &le) {
		return errf(le.Path, "", -1, ErrSymlinkOutside, "links to %s, outside %s (use --follow-links if you trust it)", le.Target, le.Dir)
	}
	return err
}

// CheckLinks applies ferry's symlink policy to every file of a model
// directory that is not opened as a checkpoint (an adapter directory):
// nil, or a bad-input error naming the link and its target.
func CheckLinks(dir string, opt DirOptions) error { return checkLinks(dir, opt) }

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Lookup finds a tensor by name.
func (c *Checkpoint) Lookup(name string) (Location, bool) {
	l, ok := c.byName[name]
	return l, ok
}

// Tensors lists every tensor: shards in name order, tensors in offset order.
func (c *Checkpoint) Tensors() []Location { return c.order }

// TotalBytes is the sum of all tensor sizes.
func (c *Checkpoint) TotalBytes() int64 {
	var n int64
	for _, l := range c.order {
		n += l.Info.Size()
	}
	return n
}

// Close closes every shard.
func (c *Checkpoint) Close() error {
	var first error
	for _, s := range c.Shards {
		if err := s.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
