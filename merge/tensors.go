package merge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// readF32 reads a whole adapter tensor (factors, magnitudes: small) as
// float32, the way PEFT's autocast holds adapter weights.
func (e *executor) readF32(name string) ([]float32, error) {
	ad := e.p.adapter
	t, ok := ad.Tensor(name)
	if !ok {
		return nil, fmt.Errorf("%s: tensor %q vanished", ad.Path, name)
	}
	buf := make([]byte, t.Size())
	if _, err := ad.Section(t).ReadAt(buf, 0); err != nil {
		return nil, fmt.Errorf("%s: tensor %q at offset %d: %w", ad.Path, name, ad.DataOffset()+t.Begin, err)
	}
	out := make([]float32, t.NumElements())
	if err := tensor.ToF32(t.DType, out, buf); err != nil {
		return nil, err
	}
	return out, nil
}

func transposeF32(src []float32, rows, cols int) []float32 {
	dst := make([]float32, len(src))
	for i := 0; i < rows; i++ {
		for j := 0; j < cols; j++ {
			dst[j*rows+i] = src[i*cols+j]
		}
	}
	return dst
}

// modMath is one module's merge in the stored layout of the base tensor:
// ΔW_stored = s·(L·R) with L rows×r and R r×cols.
type modMath struct {
	rows, cols, r int
	L, R          []float32
	s             float32
	mag           []float32 // DoRA magnitudes (per row or per column)
	colwise       bool      // DoRA norm over stored dim 0 (fan_in_fan_out, Embedding)
	colFactor     []float32 // per-column DoRA factor, from the first pass
	doubleRound   tensor.DType
	inDType       tensor.DType
	outDType      tensor.DType
}

func (e *executor) prepare(m Module, in, out tensor.DType) (*modMath, error) {
	A, err := e.readF32(m.A)
	if err != nil {
		return nil, err
	}
	B, err := e.readF32(m.B)
	if err != nil {
		return nil, err
	}
	mm := &modMath{rows: int(m.Rows), cols: int(m.Cols), r: m.Rank, s: float32(m.Scaling), inDType: in, outDType: out}
	// Linear: W (out,in) = B (out,r) · A (r,in). fan_in_fan_out and
	// Embedding store the transpose: Wᵀ = Aᵀ · Bᵀ.
	if m.Kind == KindEmbedding || m.FanInFanOut {
		mm.L = transposeF32(A, m.Rank, mm.rows)
		mm.R = transposeF32(B, mm.cols, m.Rank)
		mm.colwise = true
	} else {
		mm.L, mm.R = B, A
	}
	if m.DoRA {
		if mm.mag, err = e.readF32(m.Magnitude); err != nil {
			return nil, err
		}
	}
	if m.Kind == KindEmbedding && !m.DoRA && out != tensor.F32 {
		// PEFT's Embedding.merge adds delta.to(orig_dtype): ΔW is rounded
		// to the weight's dtype before the sum. Merged into float32 (as
		// PEFT on a float32 copy of the base) that rounding is exact, so
		// it is skipped rather than done in the base's narrower dtype.
		mm.doubleRound = out
	}
	return mm, nil
}

func (mm *modMath) blockRows(target int) int { return blockRows(target, mm.rows, mm.cols) }

// blockRows is the rows of one row block of a rows×cols tensor for a
// target of elements per block.
func blockRows(target, rows, cols int) int {
	return min(max(target/cols, 1), rows)
}

// computeV fills b.d with V = W + s·(L·R) for the block's rows.
func (mm *modMath) computeV(b *block, sec *io.SectionReader, inSize int) error {
	n, cols := b.n, mm.cols
	raw := b.raw[:n*cols*inSize]
	if _, err := sec.ReadAt(raw, int64(b.start*cols*inSize)); err != nil {
		return err
	}
	w := b.w[:n*cols]
	if err := tensor.ToF32(mm.inDType, w, raw); err != nil {
		return err
	}
	d := b.d[:n*cols]
	lowRank(d, mm.L[b.start*mm.r:(b.start+n)*mm.r], mm.R, n, mm.r, cols)
	if mm.doubleRound != "" {
		for j := range d {
			d[j] = tensor.RoundTo(mm.doubleRound, float32(d[j]*mm.s))
		}
		for j := range d {
			d[j] = w[j] + d[j]
		}
		return nil
	}
	addScaled(d, w, d, mm.s)
	return nil
}

// mergeTensor streams one merged weight to w, from row block first on (the
// blocks before it were written by an earlier run).
func (e *executor) mergeTensor(ctx context.Context, w io.Writer, sh *safetensors.Shard, info safetensors.TensorInfo, t TensorOp, first int) error {
	m := e.p.Modules[t.Module]
	where := func(err error) error {
		if _, ok := errors.AsType[*InputError](err); ok {
			return err // names the file, tensor and offset itself
		}
		return fmt.Errorf("%s: tensor %q (module %s): %w", sh.Path, info.Name, m.Name, err)
	}
	mm, err := e.prepare(m, info.DType, t.DType)
	if err != nil {
		return where(err)
	}
	sec := sh.Section(info)
	inSize := info.DType.Bits() / 8
	outSize := t.DType.Bits() / 8
	nb := mm.blockRows(e.opt.BlockElems)
	nBlocks := (mm.rows + nb - 1) / nb
	get := func() *block { return e.getBlock(nb*mm.cols, max(inSize, outSize)) }
	span := func(i int) (int, int) {
		s := i * nb
		return s, min(nb, mm.rows-s)
	}

	if m.DoRA && mm.colwise {
		// First pass: column norms of V over all rows, summed in float64
		// in block order (deterministic for any worker count).
		sq := make([]float64, mm.cols)
		err := ordered(ctx, nBlocks, e.opt.Jobs, e.opt.Cores, func(i int) (*block, error) {
			b := get()
			b.start, b.n = span(i)
			if err := mm.computeV(b, sec, inSize); err != nil {
				return b, err
			}
			if cap(b.colSq) < mm.cols {
				b.colSq = make([]float64, mm.cols)
			}
			b.colSq = b.colSq[:mm.cols]
			clear(b.colSq)
			for r := 0; r < b.n; r++ {
				row := b.d[r*mm.cols : (r+1)*mm.cols]
				for j, v := range row {
					b.colSq[j] += float64(v) * float64(v)
				}
			}
			return b, nil
		}, func(b *block) error {
			for j, v := range b.colSq {
				sq[j] += v
			}
			e.putBlock(b)
			return nil
		})
		if err != nil {
			return where(err)
		}
		mm.colFactor = make([]float32, mm.cols)
		for j := range sq {
			mm.colFactor[j] = mm.mag[j] / float32(math.Sqrt(sq[j]))
		}
	}

	work := func(i int) (*block, error) {
		b := get()
		b.start, b.n = span(i)
		if err := mm.computeV(b, sec, inSize); err != nil {
			return b, err
		}
		v := b.d[:b.n*mm.cols]
		switch {
		case m.DoRA && mm.colwise:
			for r := 0; r < b.n; r++ {
				row := v[r*mm.cols : (r+1)*mm.cols]
				for j := range row {
					row[j] = mm.colFactor[j] * row[j]
				}
			}
		case m.DoRA:
			b.out = b.raw[:len(v)*outSize]
			for r := 0; r < b.n; r++ {
				row := v[r*mm.cols : (r+1)*mm.cols]
				f := mm.mag[b.start+r] / rowNorm(row)
				if t.DType == tensor.BF16 {
					scaleToBF16(b.out[r*mm.cols*2:(r+1)*mm.cols*2], row, f)
				} else {
					scaleRow(row, f)
				}
			}
			if t.DType == tensor.BF16 {
				return b, nil
			}
		}
		b.out = b.raw[:len(v)*outSize]
		return b, tensor.FromF32(t.DType, b.out, v)
	}
	var nonFinite int64
	err = ordered(ctx, nBlocks-first, e.opt.Jobs, e.opt.Cores, func(i int) (*block, error) {
		b, err := work(first + i)
		if err != nil {
			return b, err
		}
		b.nonFinite, err = checkMerged(t.DType, b.out, b.w[:b.n*mm.cols], int64(b.start*mm.cols), sh, info, m.Name, e.opt.AllowNonFinite)
		return b, err
	}, func(b *block) error {
		if _, err := w.Write(b.out); err != nil {
			return err
		}
		nonFinite += b.nonFinite
		e.advance(int64(b.n * mm.cols * inSize))
		e.putBlock(b)
		return nil
	})
	if err != nil {
		return where(err)
	}
	e.reportNonFinite(t.Module, info.Name, nonFinite)
	return nil
}

func (e *executor) reportNonFinite(module int, tensor string, n int64) {
	if n > 0 && e.opt.NonFinite != nil {
		e.mu.Lock() // shards report from their own goroutines
		defer e.mu.Unlock()
		e.opt.NonFinite(module, tensor, n)
	}
}

// biasTensor writes b' = b + s·lora_B.bias (float32, one rounding).
func (e *executor) biasTensor(w io.Writer, sh *safetensors.Shard, info safetensors.TensorInfo, t TensorOp) error {
	m := e.p.Modules[t.Module]
	lb, err := e.readF32(m.LoraBias)
	if err != nil {
		return err
	}
	raw := make([]byte, info.Size())
	if _, err := sh.Section(info).ReadAt(raw, 0); err != nil {
		return fmt.Errorf("%s: tensor %q: %w", sh.Path, info.Name, err)
	}
	b := make([]float32, info.NumElements())
	if err := tensor.ToF32(info.DType, b, raw); err != nil {
		return err
	}
	s := float32(m.Scaling)
	for i := range b {
		b[i] = b[i] + float32(lb[i]*s)
	}
	out := make([]byte, len(b)*t.DType.Bits()/8)
	if err := tensor.FromF32(t.DType, out, b); err != nil {
		return err
	}
	// b now holds the merged values; the check wants the base's.
	base := make([]float32, len(b))
	if err := tensor.ToF32(info.DType, base, raw); err != nil {
		return err
	}
	nonFinite, err := checkMerged(t.DType, out, base, 0, sh, info, m.Name, e.opt.AllowNonFinite)
	if err != nil {
		return err
	}
	e.reportNonFinite(t.Module, info.Name, nonFinite)
	_, err = w.Write(out)
	e.advance(info.Size())
	return err
}

// replaceChunk is how many elements replaceTensor converts at a time.
const replaceChunk = 1 << 20

// replaceTensor writes a full replacement from the adapter, converted to
// the output dtype (bytes verbatim when the dtypes agree), from output byte
// from on (a multiple of replaceChunk elements when converting).
func (e *executor) replaceTensor(w io.Writer, info safetensors.TensorInfo, t TensorOp, from int64) error {
	ad := e.p.adapter
	src, _ := ad.Tensor(t.Source)
	if src.DType == t.DType {
		sec := ad.Section(src)
		buf := e.copyBuf()
		defer e.putCopyBuf(buf)
		if err := copySection(w, io.NewSectionReader(sec, from, sec.Size()-from), func(int64) {}, *buf); err != nil {
			return fmt.Errorf("%s: tensor %q: %w", ad.Path, t.Source, err)
		}
	} else {
		// Convert in chunks: a replaced lm_head can be gigabytes.
		sec := ad.Section(src)
		inW, outW := src.DType.Bits()/8, t.DType.Bits()/8
		const chunk = replaceChunk
		in := make([]byte, chunk*inW)
		v := make([]float32, chunk)
		out := make([]byte, chunk*outW)
		for off, n := from/int64(outW), src.NumElements(); off < n; off += chunk {
			k := int(min(chunk, n-off))
			if _, err := sec.ReadAt(in[:k*inW], off*int64(inW)); err != nil {
				return fmt.Errorf("%s: tensor %q: %w", ad.Path, t.Source, err)
			}
			if err := tensor.ToF32(src.DType, v[:k], in[:k*inW]); err != nil {
				return err
			}
			if err := tensor.FromF32(t.DType, out[:k*outW], v[:k]); err != nil {
				return err
			}
			if _, err := w.Write(out[:k*outW]); err != nil {
				return err
			}
		}
	}
	e.advance(info.Size())
	return nil
}
