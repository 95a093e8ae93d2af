package gguf

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/ferry-llm/ferry/internal/errkind"
)

// Split GGUF files, as llama.cpp's llama-gguf-split --split writes them
// (tools/gguf-split/gguf-split.cpp at 34af94c) and its model loader reads
// them:
//
//   - the parts are PREFIX-00001-of-0000N.gguf … PREFIX-0000N-of-0000N.gguf
//     (llama_split_path: "%s-%05d-of-%05d.gguf", numbered from 1);
//   - every part is a GGUF file of its own; the first carries all of the
//     model's metadata, the others none, and each ends its KVs with
//     split.no (UINT16, numbered from 0), split.tensors.count (INT32, the
//     tensors of all parts) and split.count (UINT16), in that order
//     (gguf_set_val_* removes a key and appends it again, and split.count is
//     set last, once the number of parts is known);
//   - the tensors keep the file's order; a part holds the tensors from
//     where the one before it stopped;
//   - --split-max-tensors N starts a part at every tensor index that is a
//     multiple of N;
//   - --split-max-size N starts a part before a tensor that would take the
//     part's tensor bytes, each tensor padded to 32 bytes, past N. The
//     header is not counted. M is 1000*1000 bytes and G 1000*1000*1000
//     (split_str_to_n_bytes), not MiB and GiB. A first tensor larger than N
//     is refused (gguf-split: "one of splits have 0 tensors"); a larger one
//     later gets a part of its own;
//   - every part is laid out at the default alignment, 32.

// Split metadata keys (LLM_KV_SPLIT_*).
const (
	KeySplitNo      = "split.no"
	KeySplitCount   = "split.count"
	KeySplitTensors = "split.tensors.count"
)

// MaxSplitParts is the most parts a split can have: split.count is a
// UINT16, and the names hold five digits.
const MaxSplitParts = 65535

// Errors of split files and split options.
var (
	// ErrSplit: a part of a split is missing or does not belong to the
	// split (another count, number or tensor total), or a split's first
	// part is not named as llama.cpp names it.
	ErrSplit = errors.New("broken split GGUF")
	// ErrSplitOptions: split options that cannot be met (both limits, a
	// limit of zero, a first tensor larger than the size limit, too many
	// parts).
	ErrSplitOptions = errkind.New(errkind.Usage, "invalid split options")
)

// SplitOptions say how a file is cut into parts; the zero value writes one
// file.
type SplitOptions struct {
	// MaxBytes is --split-max-size: the most tensor bytes (each padded to
	// 32) a part holds.
	MaxBytes int64
	// MaxTensors is --split-max-tensors: the most tensors a part holds.
	MaxTensors int
}

// Enabled reports whether the options ask for a split.
func (o SplitOptions) Enabled() bool { return o.MaxBytes != 0 || o.MaxTensors != 0 }

// Check refuses options llama-gguf-split refuses: both limits at once, or
// a limit that is not positive.
func (o SplitOptions) Check() error {
	switch {
	case o.MaxBytes != 0 && o.MaxTensors != 0:
		return fmt.Errorf("%w: give a maximum size or a maximum number of tensors per part, not both", ErrSplitOptions)
	case o.MaxBytes < 0:
		return fmt.Errorf("%w: maximum size %d is not positive", ErrSplitOptions, o.MaxBytes)
	case o.MaxTensors < 0:
		return fmt.Errorf("%w: maximum tensors %d is not positive", ErrSplitOptions, o.MaxTensors)
	}
	return nil
}

// String is the options as the flags take them ("" for none).
func (o SplitOptions) String() string {
	switch {
	case o.MaxBytes != 0:
		return "max size " + FormatSplitSize(o.MaxBytes)
	case o.MaxTensors != 0:
		return fmt.Sprintf("max %d tensors", o.MaxTensors)
	}
	return ""
}

var splitSizeRE = regexp.MustCompile(`^([0-9]+)([MG])$`)

// ParseSplitSize reads a --split-max-size value: a positive whole number
// and M (1000*1000 bytes) or G (1000*1000*1000 bytes), as llama-gguf-split
// takes it ("50G", "2000M").
func ParseSplitSize(s string) (int64, error) {
	m := splitSizeRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, fmt.Errorf("%w: size %q: want a whole number and M or G (decimal: 1M = 1000000 bytes), e.g. 50G", ErrSplitOptions, s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	unit := int64(1000 * 1000)
	if m[2] == "G" {
		unit *= 1000
	}
	if err != nil || n <= 0 || n > (1<<62)/unit {
		return 0, fmt.Errorf("%w: size %q is out of range", ErrSplitOptions, s)
	}
	return n * unit, nil
}

// FormatSplitSize writes a size as ParseSplitSize reads it when it is a
// whole number of G or M, else as bytes.
func FormatSplitSize(n int64) string {
	switch {
	case n%1e9 == 0:
		return strconv.FormatInt(n/1e9, 10) + "G"
	case n%1e6 == 0:
		return strconv.FormatInt(n/1e6, 10) + "M"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// SplitPrefix is the prefix the parts of a split written for out are named
// after: out without a final .gguf.
func SplitPrefix(out string) string {
	if strings.HasSuffix(strings.ToLower(out), ".gguf") {
		return out[:len(out)-len(".gguf")]
	}
	return out
}

// SplitName is the name of part no (from 0) of count: PREFIX-00001-of-00003.gguf
// for no 0 of 3.
func SplitName(prefix string, no, count int) string {
	return fmt.Sprintf("%s-%05d-of-%05d.gguf", prefix, no+1, count)
}

var splitNameRE = regexp.MustCompile(`^(.+)-([0-9]{5})-of-([0-9]{5})\.gguf$`)

// ParseSplitName reads a part's name: its prefix, number (from 0) and
// count. ok is false for a name that is not a part's.
func ParseSplitName(path string) (prefix string, no, count int, ok bool) {
	dir, base := filepath.Split(path)
	m := splitNameRE.FindStringSubmatch(base)
	if m == nil {
		return "", 0, 0, false
	}
	n, _ := strconv.Atoi(m[2])
	c, _ := strconv.Atoi(m[3])
	if n < 1 || n > c {
		return "", 0, 0, false
	}
	return dir + m[1], n - 1, c, true
}

// SplitFiles lists the files of a split given any of its parts' names (by
// name only, without opening them): every part's path in order. ok is
// false when path is not named as a part.
func SplitFiles(path string) (files []string, ok bool) {
	prefix, _, count, ok := ParseSplitName(path)
	if !ok {
		return nil, false
	}
	for k := range count {
		files = append(files, SplitName(prefix, k, count))
	}
	return files, true
}

// Split is a planned split of a layout: the layout of every part, and
// which tensors each holds.
type Split struct {
	Parts []*Layout
	// First[p] is the index (in the whole file's order) of part p's first
	// tensor; First[len(Parts)] is the number of tensors.
	First []int
}

// Part is the part holding tensor i and the tensor's index there.
func (s *Split) Part(i int) (part, local int) {
	lo, hi := 0, len(s.Parts)-1
	for lo < hi { // the last part whose First is ≤ i
		mid := (lo + hi + 1) / 2
		if s.First[mid] <= i {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo, i - s.First[lo]
}

// WithSplit returns a copy of l cut into parts as llama-gguf-split --split
// cuts the file l describes, whose metadata is kvs (the KVs l was planned
// with); o not Enabled returns l itself. The copy keeps the whole file's
// header, tensors, offsets and size (the file the parts are a split of),
// and Split holds the parts.
func (l *Layout) WithSplit(kvs []KV, o SplitOptions) (*Layout, error) {
	if !o.Enabled() {
		return l, nil
	}
	if err := o.Check(); err != nil {
		return nil, err
	}
	if l.Alignment != DefaultAlignment {
		// gguf-split copies general.alignment into the first part but lays
		// every part out at 32: refuse rather than write such a file.
		return nil, fmt.Errorf("%w: the file's alignment is %d; llama-gguf-split lays parts out at %d", ErrSplitOptions, l.Alignment, DefaultAlignment)
	}
	n := len(l.Tensors)
	first := []int{0}
	var cur uint64
	for i, t := range l.Tensors {
		padded, _ := alignUp(uint64(t.Size()), DefaultAlignment)
		split := false
		if o.MaxBytes > 0 {
			split = cur+padded > uint64(o.MaxBytes)
		} else {
			split = i > 0 && i%o.MaxTensors == 0
		}
		if split {
			if i == first[len(first)-1] {
				return nil, fmt.Errorf("%w: tensor %q takes %d bytes, more than the %s a part may hold", ErrSplitOptions, t.Name, padded, FormatSplitSize(o.MaxBytes))
			}
			first = append(first, i)
			cur = padded
		} else {
			cur += padded
		}
	}
	count := len(first)
	if count > MaxSplitParts {
		return nil, fmt.Errorf("%w: %d parts, at most %d", ErrSplitOptions, count, MaxSplitParts)
	}
	first = append(first, n)
	s := &Split{First: first}
	var model []KV
	for _, kv := range kvs {
		if kv.Key != KeySplitNo && kv.Key != KeySplitCount && kv.Key != KeySplitTensors {
			model = append(model, kv)
		}
	}
	for p := range count {
		var pkvs []KV
		if p == 0 {
			pkvs = append(pkvs, model...)
		}
		pkvs = append(pkvs, KV{KeySplitNo, ValueUint16, uint16(p)}, I32(KeySplitTensors, int32(n)), KV{KeySplitCount, ValueUint16, uint16(count)})
		specs := make([]TensorSpec, 0, first[p+1]-first[p])
		for _, t := range l.Tensors[first[p]:first[p+1]] {
			specs = append(specs, TensorSpec{Name: t.Name, Dims: t.Dims, Type: t.Type})
		}
		pl, err := PlanLayout(pkvs, specs, DefaultAlignment)
		if err != nil {
			return nil, fmt.Errorf("split part %d of %d: %w", p+1, count, err)
		}
		s.Parts = append(s.Parts, pl)
	}
	c := *l
	c.Split = s
	return &c, nil
}

// Files are the paths a file planned by l and written as out ends up as:
// out itself, or the parts of its split (SplitName of SplitPrefix(out)).
func (l *Layout) Files(out string) []string {
	if l.Split == nil {
		return []string{out}
	}
	prefix := SplitPrefix(out)
	files := make([]string, len(l.Split.Parts))
	for p := range files {
		files[p] = SplitName(prefix, p, len(files))
	}
	return files
}

// FileLayouts are the layouts of Files, in order.
func (l *Layout) FileLayouts() []*Layout {
	if l.Split == nil {
		return []*Layout{l}
	}
	return l.Split.Parts
}

// OutputSize is the bytes written: the file's size, or the parts'
// together.
func (l *Layout) OutputSize() int64 {
	var n int64
	for _, pl := range l.FileLayouts() {
		n += pl.Size
	}
	return n
}

// Locate is where tensor i is written: the file (an index into Files) and
// the tensor's absolute offset there.
func (l *Layout) Locate(i int) (file int, off int64) {
	if l.Split == nil {
		return 0, l.TensorOffset(i)
	}
	p, k := l.Split.Part(i)
	return p, l.Split.Parts[p].TensorOffset(k)
}

// StampHeaders are the headers of every file written (the one header, or
// each part's), for a resume stamp.
func (l *Layout) StampHeaders() [][]byte {
	var hs [][]byte
	for _, pl := range l.FileLayouts() {
		hs = append(hs, pl.Header)
	}
	return hs
}
