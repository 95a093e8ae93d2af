package convert

import (
	"context"
	"fmt"
	"io"
	"runtime"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/internal/cpushare"
	"github.com/ferry-llm/ferry/tensor"
)

// WriteOptions tune Write.
type WriteOptions struct {
	// Jobs is the number of tensor workers (default: the core count). The
	// output is byte-identical for every value.
	Jobs int
	// NoSync writes the file as cp does, without fsync
	// (gguf.Options.NoSync).
	NoSync bool
	// ChunkElems bounds the elements a worker holds at once (default
	// 1Mi): peak memory is about Jobs × ChunkElems × 8 bytes (16 with F64
	// sources).
	ChunkElems int64
	// Resume reuses out+".partial" from an interrupted run when its header
	// matches the plan. Verify then decides, per tensor, whether the bytes
	// already there are complete (the caller compares them with its
	// journal); tensors it accepts are not rewritten. Without Verify every
	// tensor is rewritten.
	Resume bool
	Verify func(i int, name string, r *io.SectionReader) bool
	// Progress receives the number of checkpoint bytes consumed, from any
	// worker goroutine.
	Progress func(n int64)
	// Digest, when set, receives the sha256 of the finished file (header,
	// tensors and padding) after Write renamed it into place. It is
	// computed while the tensors are written, by a reader that follows the
	// workers through the page cache in file order, so the file is not read
	// again afterwards (a resumed run reads back the tensors it skipped).
	Digest func(sum []byte)
	// FileDigests, when set, receives the sha256 of every file written
	// (Layout.Files: the file, or each part of a split), in order, hashed
	// the same way. Digest is called only for a layout of one file.
	FileDigests func(sums [][]byte)
	// Cores, if set, is held by each worker and offered between row
	// blocks (gguf.UnitWork.Cores): the process's cores shared with other
	// work by priority (cpushare).
	Cores *cpushare.Share
	// TensorDone is called, from worker goroutines (so it must be safe for
	// concurrent use), after tensor i's bytes are written (not yet fsynced;
	// the file is fsynced before it is renamed into place).
	TensorDone func(i int, name string)
	// NonFinite, when set, is told of checkpoint values that are NaN or
	// ±Inf: n of them in the part of tensor i just converted. They are
	// converted faithfully (NaN stays NaN, Inf stays Inf), as the reference
	// converter does; the caller decides how to warn. Called from worker
	// goroutines; tensors a resume skips are not scanned.
	NonFinite func(i int, name string, n int64)
}

type unit = gguf.Unit

// Write executes p into the file out (written as out+".partial" and
// renamed when complete). On error or cancellation the partial file is
// kept for a resume and out is not touched.
func Write(ctx context.Context, p *Plan, out string, wo WriteOptions) error {
	jobs := wo.Jobs
	if jobs <= 0 {
		jobs = runtime.GOMAXPROCS(0)
	}
	chunk := wo.ChunkElems
	if chunk <= 0 {
		chunk = 1 << 20
	}
	w, err := gguf.Create(out, p.Layout, gguf.Options{Resume: wo.Resume, NoSync: wo.NoSync})
	if err != nil {
		return err
	}
	var units []unit
	for i, t := range p.Tensors {
		if w.Resumed() && wo.Verify != nil && wo.Verify(i, t.Name, w.Section(i)) {
			w.Skip(i)
			if wo.Progress != nil {
				wo.Progress(t.inputBytes())
			}
			continue
		}
		R, C := t.vt.rows(), t.vt.cols()
		units = gguf.SplitRows(units, i, R, chunk/max(C, 1))
	}

	var hf *gguf.HashFollower
	if wo.Digest != nil || wo.FileDigests != nil {
		start := make([]int64, len(units))
		for k, u := range units {
			off, _ := unitSpan(p, u)
			start[k] = w.TensorStart(u.T) + off
		}
		if hf, err = gguf.NewHashFollower(w, start); err != nil {
			w.Detach()
			return err
		}
	}
	uw := gguf.UnitWork{Jobs: jobs, Cores: wo.Cores}
	bufs := make([]buffers, jobs)
	uw.Make = func(worker, k int) ([]byte, int64, error) {
		b := &bufs[worker]
		u := units[k]
		off, consumed, nonFinite, err := convertUnit(p, u, b)
		if err != nil {
			return nil, 0, err
		}
		if nonFinite > 0 && wo.NonFinite != nil {
			wo.NonFinite(u.T, p.Tensors[u.T].Name, nonFinite)
		}
		b.consumed = consumed
		return b.out, off, nil
	}
	uw.Written = func(worker, k int) {
		hf.Written(k)
		if wo.Progress != nil {
			wo.Progress(bufs[worker].consumed)
		}
	}
	if wo.TensorDone != nil {
		uw.Done = func(t int) { wo.TensorDone(t, p.Tensors[t].Name) }
	}
	if hf != nil {
		uw.Also = hf.Run
	}
	if err := w.WriteUnits(ctx, units, uw); err != nil {
		w.Detach()
		return err
	}
	if err := ctx.Err(); err != nil {
		w.Detach()
		return err
	}
	if err := w.Close(); err != nil {
		w.Detach() // keeps the partial file; a no-op once Close got that far
		return err
	}
	if hf != nil {
		sums := hf.Sums()
		if wo.Digest != nil && len(sums) == 1 {
			wo.Digest(sums[0])
		}
		if wo.FileDigests != nil {
			wo.FileDigests(sums)
		}
	}
	return nil
}

func (t TensorPlan) inputBytes() int64 {
	var n int64
	for _, s := range t.vt.srcs {
		n += s.Loc.Info.Size()
	}
	return n
}

// buffers are one worker's scratch space, reused across units.
type buffers struct {
	consumed int64 // checkpoint bytes the last unit read
	f32      []float32
	raw      []byte
	out      []byte
	row      []float32
	perm     []int64
}

func grow[T any](s []T, n int64) []T {
	if int64(cap(s)) < n {
		return make([]T, n)
	}
	return s[:n]
}

// convertUnit reads and converts unit u into b.out and returns the byte
// offset within the tensor where b.out belongs, the checkpoint bytes it
// consumed, and how many of the values read were NaN or ±Inf.
func convertUnit(p *Plan, u unit, b *buffers) (off, consumed, nonFinite int64, err error) {
	t := &p.Tensors[u.T]
	v := t.vt
	C := v.cols()
	rowBytes, _ := t.Type.RowSize(uint64(C))
	b.out = grow(b.out, (u.R1-u.R0)*int64(rowBytes))
	direct, kernel := directKernel(t)
	// A column permutation without element ops commutes with the element
	// conversion: convert the source rows, then gather their columns.
	permuted := direct && v.col != nil
	if permuted {
		if err = colPerm(t, b); err != nil {
			return 0, 0, 0, err
		}
	}
	if !direct {
		b.f32 = grow(b.f32, (u.R1-u.R0)*C)
	}
	// Output rows [i, j) come from consecutive rows of one source: one read.
	for i := u.R0; i < u.R1; {
		s, r := v.row(i)
		j := i + 1
		for j < u.R1 {
			s2, r2 := v.row(j)
			if s2 != s || r2 != r+(j-i) {
				break
			}
			j++
		}
		src := v.srcs[s]
		es := int64(src.DType.Bits() / 8)
		srcElems := src.Loc.Info.Size() / es
		if srcElems%C != 0 || r < 0 || (r+(j-i))*C > srcElems {
			return 0, 0, 0, fmt.Errorf("%s: tensor %q: internal plan error: rows %d..%d of %d columns outside %d elements", src.Loc.Shard.Path, src.HFName, r, r+(j-i), C, srcElems)
		}
		nb := (j - i) * C * es
		if direct && int64(rowBytes) != C*es {
			return 0, 0, 0, fmt.Errorf("tensor %q: internal plan error: direct conversion from %d-byte to %d-byte rows", t.Name, C*es, rowBytes)
		}
		off := src.Loc.Shard.DataOffset() + src.Loc.Info.Begin + r*C*es
		// Direct conversions keep the element width (rowBytes == C·es).
		dst := b.out[(i-u.R0)*int64(rowBytes) : (j-u.R0)*int64(rowBytes)]
		var in []byte
		if direct && !permuted { // read into the output, convert in place
			in = dst
		} else {
			b.raw = grow(b.raw, nb)
			in = b.raw
		}
		if _, err := src.Loc.Shard.ReaderAt().ReadAt(in, off); err != nil {
			return 0, 0, 0, fmt.Errorf("%s: tensor %q at offset %d: %w", src.Loc.Shard.Path, src.HFName, off, err)
		}
		switch {
		case direct && permuted:
			gatherCols(dst, in, b.perm, int(es))
			if kernel != nil {
				nonFinite += kernel(dst, dst)
			} else {
				nonFinite += countNonFinite(src.DType, dst)
			}
		case direct && kernel != nil:
			nonFinite += kernel(dst, dst) // counts while converting
		case direct: // a plain copy: the bytes are in place
			nonFinite += countNonFinite(src.DType, in)
		default:
			nonFinite += countNonFinite(src.DType, in)
			if err := tensor.ToF32(src.DType, b.f32[(i-u.R0)*C:(j-u.R0)*C], in); err != nil {
				return 0, 0, 0, fmt.Errorf("%s: tensor %q: %w", src.Loc.Shard.Path, src.HFName, err)
			}
		}
		consumed += nb
		i = j
	}
	if !direct {
		if err := transformEncode(t, b, u); err != nil {
			return 0, 0, 0, err
		}
	}
	off, _ = unitSpan(p, u)
	return off, consumed, nonFinite, nil
}

// countNonFinite is how many of the dtype-d values in raw are NaN or ±Inf.
func countNonFinite(d tensor.DType, raw []byte) int64 {
	n, _ := tensor.NonFinite(d, raw)
	return n
}

// unitSpan is the byte range [off, off+n) of unit u within its tensor.
func unitSpan(p *Plan, u unit) (off, n int64) {
	t := &p.Tensors[u.T]
	rowBytes, _ := t.Type.RowSize(uint64(t.vt.cols()))
	return u.R0 * int64(rowBytes), (u.R1 - u.R0) * int64(rowBytes)
}

// colPerm fills b.perm with tensor t's column permutation (output column
// c is source column b.perm[c]), checked to stay inside the row.
func colPerm(t *TensorPlan, b *buffers) error {
	v := t.vt
	C := v.cols()
	b.perm = grow(b.perm, C)
	for c := int64(0); c < C; c++ {
		b.perm[c] = v.col(c)
		if b.perm[c] < 0 || b.perm[c] >= C {
			return fmt.Errorf("tensor %q: internal plan error: column %d maps to %d", t.Name, c, b.perm[c])
		}
	}
	return nil
}

// gatherCols writes the rows of src into dst with their columns permuted:
// dst[row][c] = src[row][perm[c]], elements of es bytes.
func gatherCols(dst, src []byte, perm []int64, es int) {
	C := len(perm)
	rowBytes := C * es
	for r := 0; r+rowBytes <= len(dst); r += rowBytes {
		d, s := dst[r:r+rowBytes], src[r:r+rowBytes]
		switch es {
		case 2:
			for c, pc := range perm {
				d[2*c], d[2*c+1] = s[2*pc], s[2*pc+1]
			}
		case 4:
			for c, pc := range perm {
				copy(d[4*c:4*c+4], s[4*pc:4*pc+4])
			}
		default:
			for c, pc := range perm {
				copy(d[es*c:es*c+es], s[int64(es)*pc:int64(es)*pc+int64(es)])
			}
		}
	}
}

// transformEncode applies the column permutation and element ops to the
// float32 rows in b.f32 and encodes them into b.out.
func transformEncode(t *TensorPlan, b *buffers, u unit) error {
	v := t.vt
	C := v.cols()
	f32 := b.f32
	if v.col != nil {
		if err := colPerm(t, b); err != nil {
			return err
		}
		b.row = grow(b.row, C)
		for r := int64(0); r < u.R1-u.R0; r++ {
			row := f32[r*C : (r+1)*C]
			copy(b.row, row)
			for c, pc := range b.perm {
				row[c] = b.row[pc]
			}
		}
	}
	for _, op := range v.ops {
		switch op {
		case opAddOne:
			for k := range f32 {
				f32[k] = f32[k] + 1
			}
		case opAddOneF16:
			// torch adds in float32 and rounds the sum to half (RNE).
			for k := range f32 {
				f32[k] = tensor.F16ToFloat32(tensor.Float32ToF16(f32[k] + 1))
			}
		case opNegExp:
			for k := range f32 {
				f32[k] = -torchExpF32(f32[k])
			}
		case opNegExpF16:
			for k := range f32 {
				f32[k] = -torchExpF16(f32[k])
			}
		}
	}
	if err := quant.Encode(t.Type, b.out, f32); err != nil {
		return fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	return nil
}
