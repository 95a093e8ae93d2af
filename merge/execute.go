package merge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/internal/inputerr"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// ExecOptions tune Execute.
type ExecOptions struct {
	// Jobs is the number of row-block workers (default: the CPU count).
	// The output bytes do not depend on it.
	Jobs int
	// Progress, if set, is called from one goroutine with base bytes done
	// (read, merged and written, or copied, or verified on resume) and the
	// total.
	Progress func(done, total int64)
	// BlockElems is the target row-block size in elements (default
	// DefaultBlockElems). Blocks are whole rows; the block size depends only
	// on this and the tensor's width, never on Jobs.
	BlockElems int
	// AllowNonFinite writes merged tensors even where the adapter makes a
	// value NaN or ±Inf (see finite.go); by default that is refused.
	AllowNonFinite bool
	// NonFinite, if set, is called once per merged tensor whose base holds
	// NaN or ±Inf (carried through the merge as they are), with their count
	// (module: index into Plan.Modules). Shards kept from an earlier run are
	// not scanned.
	NonFinite func(module int, tensor string, n int64)
}

// DefaultBlockElems makes a row block about 1 MiB of float32.
const DefaultBlockElems = 1 << 18

// FileDigest is one output file.
type FileDigest struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"` // hex, as sha256sum prints it
}

// Digest is the file's content address.
func (f FileDigest) Digest() (digest.Digest, error) { return digest.FromHex(f.SHA256) }

// Result says what Execute did.
type Result struct {
	OutDir  string       `json:"out"`
	Files   []FileDigest `json:"files"`   // shards, aux files and index, in write order
	Resumed []string     `json:"resumed"` // shards kept from an earlier run (digest verified)
	Written []string     `json:"written"` // shards written by this run
}

// Execute carries out the plan into outDir: aux files, then every shard
// (copied verbatim or rewritten), each atomically and recorded with its
// sha256 in a journal, then the index last. A killed run, re-run with the
// same inputs, keeps finished shards whose digests verify and ends with the
// same bytes. It makes no decisions of its own.
func Execute(ctx context.Context, p *Plan, outDir string, opt ExecOptions) (*Result, error) {
	if opt.Jobs <= 0 {
		opt.Jobs = runtime.NumCPU()
	}
	if opt.BlockElems <= 0 {
		opt.BlockElems = DefaultBlockElems
	}
	if !opt.AllowNonFinite {
		if err := checkAdapterFinite(p); err != nil {
			return nil, err
		}
	}
	if err := checkOutDir(p, outDir); err != nil {
		return nil, err
	}
	j, err := openJournal(outDir, p.Key)
	if err != nil {
		return nil, err
	}
	// Temp files of a killed earlier run are garbage: remove them.
	if stale, _ := filepath.Glob(filepath.Join(outDir, ".*"+fsutil.PartialSuffix)); len(stale) > 0 {
		for _, f := range stale {
			os.Remove(f)
		}
	}
	e := &executor{p: p, out: outDir, opt: opt, j: j, free: make(chan *block, opt.Jobs), copyBuf: make([]byte, 1<<20)}
	e.progress(0)
	res := &Result{OutDir: outDir}

	for _, a := range p.AuxFiles {
		d, err := copyFile(ctx, filepath.Join(p.BaseDir, a), filepath.Join(outDir, a), nil)
		if err != nil {
			return nil, err
		}
		res.Files = append(res.Files, d)
	}
	weightMap := map[string]string{}
	var total int64
	for _, sp := range p.Shards {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for _, t := range sp.Tensors {
			weightMap[t.Name] = sp.Name
			sz, _ := tensor.ByteSize(t.DType, t.Shape)
			total += sz
		}
		if d, ok := e.finished(ctx, sp); ok {
			e.advance(sp.Size)
			res.Files = append(res.Files, d)
			res.Resumed = append(res.Resumed, sp.Name)
			continue
		}
		var d FileDigest
		if sp.Rewrite {
			d, err = e.rewriteShard(ctx, sp)
		} else {
			d, err = copyFile(ctx, filepath.Join(p.BaseDir, sp.Name), filepath.Join(outDir, sp.Name), e.advance)
		}
		if err != nil {
			return nil, err
		}
		if err := j.record(d); err != nil {
			return nil, err
		}
		res.Files = append(res.Files, d)
		res.Written = append(res.Written, sp.Name)
	}
	if !p.Single {
		if err := safetensors.WriteIndex(outDir, weightMap, total, p.IndexMeta); err != nil {
			return nil, err
		}
		d, err := digestFile(ctx, filepath.Join(outDir, safetensors.IndexName))
		if err != nil {
			return nil, err
		}
		res.Files = append(res.Files, d)
	}
	if err := j.complete(); err != nil {
		return nil, err
	}
	e.progress(p.TotalBytes)
	return res, nil
}

// checkOutDir refuses to write over, into or around an input
// (fsutil.CheckApart), or into a directory that is not empty and not an
// earlier run of this merge.
func checkOutDir(p *Plan, outDir string) error {
	err := fsutil.CheckApart(outDir, true, p.BaseDir, p.AdapterDir)
	var ie *inputerr.Error
	if errors.As(err, &ie) {
		return inputErr(outDir, "", -1, ErrOutputExists, "%w", ie.Err)
	}
	if err != nil {
		return err
	}
	if st, err := os.Stat(outDir); err == nil && !st.IsDir() {
		return inputErr(outDir, "", -1, ErrOutputExists, "it exists and is not a directory; choose another --out")
	}
	ents, err := os.ReadDir(outDir)
	if errors.Is(err, os.ErrNotExist) {
		return os.MkdirAll(outDir, 0o755)
	}
	if err != nil {
		return err
	}
	if len(ents) == 0 {
		return nil
	}
	if _, err := os.Stat(filepath.Join(outDir, JournalName)); err != nil {
		return inputErr(outDir, "", -1, ErrOutputExists, "it exists and is not empty, and holds no %s of an earlier ferry merge; choose another --out or remove it", JournalName)
	}
	return nil
}

type executor struct {
	p    *Plan
	out  string
	opt  ExecOptions
	j    *journal
	done int64
	mu   sync.Mutex
	// free holds row-block buffers for reuse across tensors: with at most
	// Jobs blocks in flight, merge memory stays Jobs × one block.
	free    chan *block
	copyBuf []byte // for the one goroutine that writes
}

// getBlock returns a block buffer for elems elements of up to width bytes.
func (e *executor) getBlock(elems, width int) *block {
	var b *block
	select {
	case b = <-e.free:
	default:
		b = &block{}
	}
	if cap(b.w) < elems {
		b.w = make([]float32, elems)
		b.d = make([]float32, elems)
	}
	if cap(b.raw) < elems*width {
		b.raw = make([]byte, elems*width)
	}
	b.w, b.d, b.raw = b.w[:elems], b.d[:elems], b.raw[:elems*width]
	return b
}

func (e *executor) putBlock(b *block) {
	select {
	case e.free <- b:
	default:
	}
}

func (e *executor) progress(done int64) {
	if e.opt.Progress != nil {
		e.opt.Progress(done, e.p.TotalBytes)
	}
}

func (e *executor) advance(n int64) {
	e.mu.Lock()
	e.done += n
	d := e.done
	e.mu.Unlock()
	e.progress(d)
}

// finished reports a shard an earlier run completed, re-hashing the file.
func (e *executor) finished(ctx context.Context, sp ShardPlan) (FileDigest, bool) {
	want, ok := e.j.Files[sp.Name]
	if !ok {
		return FileDigest{}, false
	}
	got, err := digestFile(ctx, filepath.Join(e.out, sp.Name))
	if err != nil || got != want {
		return FileDigest{}, false
	}
	return got, true
}

// copyFile copies src to dst atomically, hashing it as it is written.
func copyFile(ctx context.Context, src, dst string, advance func(int64)) (FileDigest, error) {
	d, n, err := fsutil.CopyAtomic(ctx, dst, src, advance)
	if err != nil {
		return FileDigest{}, err
	}
	return FileDigest{Name: filepath.Base(dst), Size: n, SHA256: d.Hex()}, nil
}

func digestFile(ctx context.Context, path string) (FileDigest, error) {
	d, n, err := hashing.File(ctx, path, nil)
	if err != nil {
		return FileDigest{}, err
	}
	return FileDigest{Name: filepath.Base(path), Size: n, SHA256: d.Hex()}, nil
}

// rewriteShard writes one shard holding adapted tensors: same tensors in the
// same order as the base shard, the base's __metadata__, merged tensors
// computed row block by row block.
func (e *executor) rewriteShard(ctx context.Context, sp ShardPlan) (FileDigest, error) {
	var sh *safetensors.Shard
	for _, s := range e.p.base.Shards {
		if s.Name == sp.Name {
			sh = s
		}
	}
	specs := make([]safetensors.TensorSpec, len(sp.Tensors))
	for i, t := range sp.Tensors {
		specs[i] = safetensors.TensorSpec{Name: t.Name, DType: t.DType, Shape: t.Shape}
	}
	f, err := safetensors.Create(filepath.Join(e.out, sp.Name), sh.Metadata, specs)
	if err != nil {
		return FileDigest{}, err
	}
	fail := func(err error) (FileDigest, error) {
		f.Abort()
		return FileDigest{}, err
	}
	e.advance(sh.DataOffset())
	for _, t := range sp.Tensors {
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		info, _ := sh.Tensor(t.Name)
		switch t.Op {
		case OpCopy:
			if err := copySection(f, sh.Section(info), e.advance, e.copyBuf); err != nil {
				return fail(fmt.Errorf("%s: tensor %q: %w", sh.Path, t.Name, err))
			}
		case OpMerge:
			if err := e.mergeTensor(ctx, f, sh, info, t); err != nil {
				return fail(err)
			}
		case OpBias:
			if err := e.biasTensor(f, sh, info, t); err != nil {
				return fail(err)
			}
		case OpReplace:
			if err := e.replaceTensor(f, info, t); err != nil {
				return fail(err)
			}
		default:
			return fail(fmt.Errorf("tensor %q: unknown op %q", t.Name, t.Op))
		}
	}
	if err := f.Close(); err != nil {
		return FileDigest{}, err
	}
	d, n := f.Sum()
	return FileDigest{Name: sp.Name, Size: n, SHA256: d.Hex()}, nil
}

func copySection(w io.Writer, r *io.SectionReader, advance func(int64), buf []byte) error {
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			advance(int64(n))
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

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

// block is one worker's buffers for a row block.
type block struct {
	start, n int
	raw      []byte    // base bytes, then output bytes
	w, d     []float32 // base rows, delta rows (then V)
	colSq    []float64 // first pass: column sums of squares
	out      []byte
	// nonFinite counts NaN/Inf of the base carried into out.
	nonFinite int64
}

func (mm *modMath) blockRows(target int) int {
	n := target / mm.cols
	if n < 1 {
		n = 1
	}
	if n > mm.rows {
		n = mm.rows
	}
	return n
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
			d[j] = roundTo(mm.doubleRound, float32(d[j]*mm.s))
		}
		for j := range d {
			d[j] = w[j] + d[j]
		}
		return nil
	}
	addScaled(d, w, d, mm.s)
	return nil
}

// roundTo rounds f to dtype d and back (RNE).
func roundTo(d tensor.DType, f float32) float32 {
	switch d {
	case tensor.BF16:
		return tensor.BF16ToFloat32(tensor.Float32ToBF16(f))
	case tensor.F16:
		return tensor.F16ToFloat32(tensor.Float32ToF16(f))
	}
	return f
}

// mergeTensor streams one merged weight to w.
func (e *executor) mergeTensor(ctx context.Context, w io.Writer, sh *safetensors.Shard, info safetensors.TensorInfo, t TensorOp) error {
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
		err := ordered(ctx, nBlocks, e.opt.Jobs, func(i int) (*block, error) {
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
	err = ordered(ctx, nBlocks, e.opt.Jobs, func(i int) (*block, error) {
		b, err := work(i)
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
		e.opt.NonFinite(module, tensor, n)
	}
}

// ordered runs work(i) for i in [0, n) on up to jobs goroutines and hands
// the results to consume in index order, one at a time. At most jobs blocks
// are alive at once.
func ordered(ctx context.Context, n, jobs int, work func(i int) (*block, error), consume func(*block) error) error {
	type result struct {
		b   *block
		err error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	slots := make([]chan result, n)
	for i := range slots {
		slots[i] = make(chan result, 1)
	}
	sem := make(chan struct{}, jobs)
	var wg sync.WaitGroup
	producerDone := make(chan struct{})
	go func() {
		defer close(producerDone)
		for i := 0; i < n; i++ {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				b, err := work(i)
				slots[i] <- result{b, err}
			}(i)
		}
	}()
	var first error
	for i := 0; i < n && first == nil; i++ {
		select {
		case r := <-slots[i]:
			if r.err != nil {
				first = r.err
			} else if err := consume(r.b); err != nil {
				first = err
			}
			<-sem
		case <-ctx.Done():
			first = ctx.Err()
		}
	}
	cancel()
	<-producerDone
	wg.Wait() // started workers finish before their buffers are dropped
	return first
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

// replaceTensor writes a full replacement from the adapter, converted to
// the output dtype (bytes verbatim when the dtypes agree).
func (e *executor) replaceTensor(w io.Writer, info safetensors.TensorInfo, t TensorOp) error {
	ad := e.p.adapter
	src, _ := ad.Tensor(t.Source)
	if src.DType == t.DType {
		if err := copySection(w, ad.Section(src), func(int64) {}, e.copyBuf); err != nil {
			return fmt.Errorf("%s: tensor %q: %w", ad.Path, t.Source, err)
		}
	} else {
		// Convert in chunks: a replaced lm_head can be gigabytes.
		sec := ad.Section(src)
		inW, outW := src.DType.Bits()/8, t.DType.Bits()/8
		const chunk = 1 << 20
		in := make([]byte, chunk*inW)
		v := make([]float32, chunk)
		out := make([]byte, chunk*outW)
		for off, n := int64(0), src.NumElements(); off < n; off += chunk {
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
