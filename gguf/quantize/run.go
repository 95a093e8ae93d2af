package quantize

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/internal/cpushare"
	"github.com/ferry-llm/ferry/internal/inputerr"
	"github.com/ferry-llm/ferry/tensor"
)

// RunOptions tune Run.
type RunOptions struct {
	// Jobs is the number of workers (default: the core count). The output
	// is byte-identical for every value.
	Jobs int
	// ChunkElems bounds the values a worker holds at once (default 1Mi,
	// at least one row): peak memory is about Jobs × ChunkElems × 10 bytes
	// (the input row block, its float32 values and the encoded block),
	// whatever the model's size.
	ChunkElems int64
	// Progress receives input tensor bytes consumed (resumed tensors
	// included), from any worker goroutine.
	Progress func(n int64)
	// Tensor, if set, is told (from worker goroutines) when a worker
	// starts on tensor i: a progress bar names it.
	Tensor func(i int, name string)
	// TensorDone, if set, is called (from worker goroutines) after tensor
	// i's bytes are written, before they are durable.
	TensorDone func(i int, name string)
	// Journal is the resume journal's path (default out + ".journal").
	Journal string
	// JournalEvery is how often finished tensors are made durable and
	// recorded (default a second; gguf.TensorJournal.Every).
	JournalEvery time.Duration
	// Errors measures every tensor's quantization error while it is made
	// (RunResult.Errors): each encoded block is decoded again and compared
	// with the values it was made from. Tensors a resume keeps are
	// quantized again for it (not written).
	Errors bool
	// NoSync writes the outputs as cp does, without fsync
	// (gguf.Options.NoSync); their journals then resume only in the same
	// boot (gguf.OpenTensorJournal).
	NoSync bool
	// Cores, if set, is held by each worker and offered between row
	// blocks (gguf.UnitWork.Cores): the process's cores shared with other
	// work by priority (cpushare).
	Cores *cpushare.Share
	// Digests computes each file's SHA-256 while it is written
	// (RunResult.Digests; gguf.HashFollower): a reader per output follows
	// the workers through the page cache, so the files are not read again
	// for their digests once written.
	Digests bool
}

// RunResult says what Run did, and after a failure what is left to resume
// (gguf.Leftover).
type RunResult struct {
	Resumed int   // tensors kept from an interrupted run
	Size    int64 // bytes written (the parts' together, for a split)
	// Files are the files written: the output, or every part of its
	// split (Plan.Layout.Files).
	Files []string
	// Errors is every tensor's error, in plan order (RunOptions.Errors).
	Errors []TensorError
	// Digests are the SHA-256 of each of Files, in order, hashed while
	// they were written (RunOptions.Digests); nil when not asked for.
	Digests [][]byte
	gguf.Leftover
}

// ErrNoSpace: the output's file system has less free space than the
// output needs.
var ErrNoSpace = errors.New("not enough free disk space")

// Run executes p, read from the input f, into out, the whole lifecycle:
// the free space for out is checked first, then the tensors are written
// to out.partial in row blocks by RunOptions.Jobs workers, the journal
// (internal/journal, via gguf.TensorJournal) records each tensor once the
// partial file is fsynced, and out.partial is fsynced and renamed to out,
// then the journal removed. The journal's ref is Stamp, so another input
// or plan starts over. An interrupted or failed run leaves out.partial and
// the journal for a resume (the same Run writes only the tensors not
// durable), or nothing when no partial file was made. It is RunMulti with
// one output. A plan with a split (Options.Split) writes the parts
// (Plan.Layout.Files) under one journal, renamed into place together.
func Run(ctx context.Context, f *gguf.File, p *Plan, out string, o RunOptions) (*RunResult, error) {
	rs, err := RunMulti(ctx, f, []Output{{Plan: p, Path: out, Journal: o.Journal}}, o)
	if len(rs) == 0 {
		return nil, err
	}
	return rs[0], err
}

// Stamp identifies a quantization: the planned header (every KV and
// tensor info, so the type and options too) and the input's path, size
// and modification time.
func Stamp(f *gguf.File, p *Plan) string {
	h := sha256.New()
	h.Write(p.Layout.Header)
	if p.Layout.Split != nil {
		for _, hd := range p.Layout.StampHeaders() {
			fmt.Fprintf(h, "\x00part\x00%d\x00", len(hd))
			h.Write(hd)
		}
	}
	if p.inputStamp != "" { // a checkpoint read through gguf/convert
		fmt.Fprintf(h, "\x00%s", p.inputStamp)
	} else if f.IsSplit() {
		for _, pt := range f.Parts { // every part of a split input
			var mt int64
			if st, err := os.Stat(pt.Path); err == nil {
				mt = st.ModTime().UnixNano()
			}
			fmt.Fprintf(h, "\x00%s\x00%d\x00%d", pt.Path, pt.Size, mt)
		}
	} else {
		var mt int64
		if st, err := os.Stat(f.Path); err == nil {
			mt = st.ModTime().UnixNano()
		}
		fmt.Fprintf(h, "\x00%s\x00%d\x00%d", f.Path, f.Size, mt)
	}
	// The importance vectors: another matrix under the same name writes
	// other bytes.
	var b [4]byte
	for _, t := range p.Tensors {
		if t.Weights == nil {
			continue
		}
		fmt.Fprintf(h, "\x00%s\x00%d\x00", t.Name, len(t.Weights))
		for _, w := range t.Weights {
			binary.LittleEndian.PutUint32(b[:], math.Float32bits(w))
			h.Write(b[:])
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// spaceNeeded is the free space out, planned as l, still needs: none for
// a file (or part) whose partial file of an interrupted run, of the
// planned size, is already there.
func spaceNeeded(out string, l *gguf.Layout) int64 {
	var n int64
	for k, path := range l.Files(out) {
		size := l.FileLayouts()[k].Size
		if st, err := os.Stat(gguf.PartialPath(path)); err == nil && st.Size() == size {
			continue // a resume reuses it
		}
		n += size
	}
	return n
}

// buffers are one worker's scratch space, reused across units.
type buffers struct {
	raw  []byte
	f32  []float32
	deq  []float32 // an output's blocks decoded again, for its errors
	outs [][]byte  // per output
	data [][]byte  // what the unit writes to each output
	offs []int64
	made []bool // outs[k] holds this unit's blocks for output k
}

func grow[T any](s []T, n int64) []T {
	if int64(cap(s)) < n {
		return make([]T, n)
	}
	return s[:n]
}

// readRows reads rows [u.R0, u.R1) of tensor t's input into b.raw.
func readRows(f *gguf.File, t *TensorPlan, u gguf.Unit, b *buffers) error {
	inRow, _ := t.InType.RowSize(ne0(t.In.Dims))
	at := f.DataOffset + int64(t.In.Offset) + u.R0*int64(inRow)
	b.raw = grow(b.raw, (u.R1-u.R0)*int64(inRow))
	if _, err := f.ReaderAt().ReadAt(b.raw, at); err != nil {
		path, off := f.Locate(t.In) // a split's part
		return fmt.Errorf("%s: tensor %q at offset %d: %w", path, t.Name, off+u.R0*int64(inRow), err)
	}
	return nil
}

// encodeRows encodes src, the float32 values of rows [u.R0, u.R1) of
// tensor t, into dst as t.Type.
func encodeRows(f *gguf.File, t *TensorPlan, u gguf.Unit, dst []byte, src []float32) error {
	if err := encode(t, dst, src, u.R0, u.R1); err != nil {
		return fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	if nf, bad := quant.Validate(t.Type, dst); bad {
		// llama-quantize's ggml_validate_row_data: refuse rather than
		// write a scale that is NaN or infinite.
		cols := ne0(t.In.Dims)
		inRow, _ := t.InType.RowSize(cols)
		row := u.R0 + int64(nf.Block)*t.Type.BlockSize()/int64(cols)
		path, off := f.Locate(t.In)
		return inputerr.New(path, t.Name, off+row*int64(inRow), ErrNonFinite,
			"row %d quantizes to a non-finite %s %s (a NaN or an infinity in the input)", row, t.Type, nf.Field)
	}
	return nil
}

// encode quantizes rows [r0, r1) of tensor t, src, into dst: with its
// importance vector when it has one, each row with the vector of the
// matrix (expert) it belongs to, as llama-quantize quantizes each of a
// tensor's ne2 matrices with its own.
func encode(t *TensorPlan, dst []byte, src []float32, r0, r1 int64) error {
	if t.Weights == nil {
		return quant.Encode(t.Type, dst, src)
	}
	cols := int64(ne0(t.In.Dims))
	perMatrix := t.rowsPerMatrix()
	outRow, _ := t.Type.RowSize(uint64(cols))
	for r := r0; r < r1; {
		m := r / perMatrix
		end := min(r1, (m+1)*perMatrix)
		i, j := r-r0, end-r0
		if err := quant.EncodeWeighted(t.Type, dst[i*int64(outRow):j*int64(outRow)], src[i*cols:j*cols], int(cols), t.Weights[m*cols:(m+1)*cols]); err != nil {
			return err
		}
		r = end
	}
	return nil
}

// rowsPerMatrix is how many rows each of the tensor's matrices (experts)
// has: ne1, each with its own importance vector.
func (t *TensorPlan) rowsPerMatrix() int64 {
	if len(t.In.Dims) > 1 {
		return max(int64(t.In.Dims[1]), 1)
	}
	return 1
}

// decode converts src, whole rows of type t, to float32 exactly as ggml
// does before quantizing (F16 and BF16 widen exactly).
func decode(t quant.Type, dst []float32, src []byte) error {
	switch t {
	case quant.F32:
		tensor.BytesToF32(dst, src)
	case quant.F16:
		tensor.F16ToF32(dst, src)
	case quant.BF16:
		tensor.BF16ToF32(dst, src)
	default:
		return quant.Decode(t, dst, src)
	}
	return nil
}
