package mlxpack

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ferry-llm/ferry/internal/cpushare"
	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/hashfollow"
	"github.com/ferry-llm/ferry/internal/journal"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
	"golang.org/x/sync/errgroup"
)

// unitElems bounds the elements one unit converts: a worker holds about
// unitElems × 14 bytes (source, float32 values, output, dequantized
// check), whatever the tensor's size.
const unitElems = 1 << 20

// unit is a block of whole rows of one tensor: the unit of work, of
// resume and of the error statistics.
type unit struct {
	t      int // index in Tensors
	r0, r1 int64
}

func (p *QuantizePlan) planUnits() {
	for i, t := range p.Tensors {
		t.unit0 = len(p.units)
		rb := max(int64(1), unitElems/max(t.cols, 1))
		if !t.Quantized() && t.rows*t.cols <= unitElems {
			rb = max(t.rows, 1)
		}
		for r := int64(0); r < t.rows || r == 0; r += rb {
			p.units = append(p.units, unit{t: i, r0: r, r1: min(r+rb, t.rows)})
			if t.rows == 0 {
				break
			}
		}
		t.units = len(p.units) - t.unit0
	}
}

// QuantizeRunOptions tune Quantize.
type QuantizeRunOptions struct {
	// Jobs is the number of workers (default: the core count). The output
	// is byte-identical for every value.
	Jobs int
	// Progress receives source bytes converted (resumed units included),
	// from any worker goroutine.
	Progress func(n int64)
	// UnitDone, if set, is called from worker goroutines after a unit's
	// bytes are written (not yet durable); tests stop a run there.
	UnitDone func(tensor string, r0, r1 int64)
	// JournalEvery is how often written units are fsynced and journaled
	// (default a second): a resume redoes at most about this much work.
	JournalEvery time.Duration
	// Cores, if set, is held by each worker from its first unit to its
	// last and offered between units: the process's cores shared with
	// other work by priority (cpushare).
	Cores *cpushare.Share
	// Digests hashes each shard while it is written, a reader per shard
	// following the workers in file order (hashfollow), so that a caller
	// adopting the files need not read them again: QuantizeResult.Digests.
	Digests bool
	// ShardDone, if set (with Digests), is called with each shard once
	// every byte of it is written, hashed and durable, and the units that
	// wrote it journaled (a resume never writes it again), while the
	// others are still being written: path is the file in the partial
	// directory, name its name in the output. A caller can hand it on
	// (the pipeline uploads it to a shared store) before the conversion
	// ends. Shards kept from an interrupted run are told too. It is called
	// from the run's goroutines, one shard at a time; an error it returns
	// fails the run, which stays resumable.
	ShardDone func(path, name string, sum FileSum) error
}

// TensorResult is one output module of the --json summary.
type TensorResult struct {
	Name      string       `json:"name"`   // the parameter (…weight)
	Module    string       `json:"module"` // its module path
	DType     tensor.DType `json:"dtype"`
	Shape     []int64      `json:"shape"`
	Bits      int          `json:"bits,omitempty"`
	GroupSize int          `json:"group_size,omitempty"`
	Bytes     int64        `json:"bytes"`
	MTP       bool         `json:"mtp,omitempty"`
	// Quantization error of the dequantized weights against the values
	// quantized (after sanitize and cast): root mean square, largest
	// absolute error, and RMS relative to the weights' RMS.
	RMSE      *float64 `json:"rmse,omitempty"`
	MaxAbsErr *float64 `json:"max_abs_err,omitempty"`
	RelRMSE   *float64 `json:"rel_rmse,omitempty"`
}

// QuantizeResult reports a conversion.
type QuantizeResult struct {
	Src          string         `json:"src"`
	Out          string         `json:"out"`
	ModelType    string         `json:"model_type"`
	Quantization map[string]any `json:"quantization,omitempty"`
	DType        tensor.DType   `json:"dtype,omitempty"`
	ConfigFixes  []string       `json:"config_fixes,omitempty"`
	MTPDropped   int            `json:"mtp_dropped"`
	MTPKept      int            `json:"mtp_kept"`
	Files        []string       `json:"files"`
	SourceBytes  int64          `json:"source_bytes"`
	OutputBytes  int64          `json:"output_bytes"`
	ResumedUnits int            `json:"resumed_units,omitempty"`
	Tensors      []TensorResult `json:"tensors"`
	// Digests are the shards' SHA-256 digests and sizes (by file name, as
	// in Files) when QuantizeRunOptions.Digests asked for them; the small
	// files (index, config, copies) are not in it.
	Digests map[string]FileSum `json:"-"`
}

// FileSum is a file's SHA-256 digest and its size, as its writer made it.
type FileSum struct {
	SHA256 []byte
	Size   int64
}

// unitStats are one unit's error sums (quantized tensors only).
type unitStats struct {
	sqErr, sq, maxErr float64
}

func (s unitStats) encode(k int) string {
	return fmt.Sprintf("%d %x %x %x", k, math.Float64bits(s.sqErr), math.Float64bits(s.sq), math.Float64bits(s.maxErr))
}

func decodeUnit(s string) (int, unitStats, bool) {
	f := strings.Fields(s)
	if len(f) != 4 {
		return 0, unitStats{}, false
	}
	k, err := strconv.Atoi(f[0])
	if err != nil || k < 0 {
		return 0, unitStats{}, false
	}
	var v [3]float64
	for i := range v {
		b, err := strconv.ParseUint(f[i+1], 16, 64)
		if err != nil {
			return 0, unitStats{}, false
		}
		v[i] = math.Float64frombits(b)
	}
	return k, unitStats{v[0], v[1], v[2]}, true
}

// PartialDir is where Quantize builds out: renamed to out when complete.
func PartialDir(out string) string { return out + fsutil.PartialSuffix }

const journalName = ".ferry-journal"

// Quantize executes plan into the directory out, which must not exist.
// The output is built in PartialDir(out) and renamed into place when
// complete, so out appears whole or not at all. Units (row blocks) are
// converted by Jobs workers, each written at its planned offset; a
// journal in the partial directory records each unit once its bytes are
// fsynced, and a run interrupted at any point (kill -9 included) resumes
// from there when started again with the same plan; a partial directory
// of another plan is started over.
func Quantize(ctx context.Context, plan *QuantizePlan, out string, o QuantizeRunOptions) (res *QuantizeResult, err error) {
	abs, err := filepath.Abs(out)
	if err != nil {
		return nil, err
	}
	if err := checkNotNested(plan.Src, abs); err != nil {
		return nil, err
	}
	if _, err := os.Lstat(abs); err == nil {
		return nil, errf(abs, "", ErrOutput, "exists: mlx quantize writes a new directory (remove it, or choose another --out)")
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	part := PartialDir(abs)
	if err := os.MkdirAll(part, 0o755); err != nil {
		return nil, err
	}
	log, entries, fresh, err := journal.Open(filepath.Join(part, journalName), plan.stamp)
	if err != nil {
		return nil, err
	}
	w := &dirWriter{plan: plan, dir: part, log: log, done: map[int]unitStats{}, last: time.Now(), every: o.JournalEvery}
	if w.every <= 0 {
		w.every = time.Second
	}
	defer func() {
		if err != nil {
			w.abandon()
		}
	}()
	if err := w.open(fresh, entries); err != nil {
		return nil, err
	}
	res = &QuantizeResult{Src: plan.Src, Out: abs, ModelType: plan.ModelType, Quantization: plan.Quantization, DType: plan.DType,
		ConfigFixes: plan.ConfigFixes, MTPDropped: len(plan.MTPDropped), MTPKept: plan.MTPKept, Files: plan.Files,
		SourceBytes: plan.SourceBytes(), OutputBytes: plan.OutputBytes(), ResumedUnits: len(w.done)}
	if o.Digests {
		if err := w.follow(); err != nil {
			return nil, err
		}
	}
	if err := w.run(ctx, o); err != nil {
		return nil, err
	}
	if w.hfs != nil {
		res.Digests = map[string]FileSum{}
		for i, hf := range w.hfs {
			res.Digests[plan.shards[i].name] = FileSum{SHA256: hf.Sums()[0], Size: plan.shards[i].size}
		}
	}
	if err := w.finish(ctx, abs); err != nil {
		return nil, err
	}
	res.Tensors = w.results()
	return res, nil
}

// dirWriter writes one plan's partial directory.
type dirWriter struct {
	plan  *QuantizePlan
	dir   string
	log   *journal.Log
	files []*shardFile
	// hfs hash each shard as it is written (QuantizeRunOptions.Digests;
	// nil: not).
	hfs []*hashfollow.Follower
	// Per shard, with hfs: the units writing it not yet written (left),
	// whether its follower is done (hashed), and whether ShardDone was
	// called (told); guarded by mu. tell serializes the calls.
	left    []int
	hashed  []bool
	told    []bool
	tell    sync.Mutex
	tellErr error // what the last ShardDone returned, under tell

	mu      sync.Mutex
	done    map[int]unitStats // durable units
	pending map[int]unitStats
	last    time.Time
	every   time.Duration
	flushMu sync.Mutex
	bg      sync.WaitGroup // flushes started by unitDone
}

// open creates (fresh) or reopens (resume) the shard files. A resume whose
// files do not have the planned size and header starts over.
func (w *dirWriter) open(fresh bool, entries []journal.Entry) error {
	if !fresh {
		for _, e := range entries {
			if k, st, ok := decodeUnit(e.Unit); ok && k < len(w.plan.units) {
				w.done[k] = st
			}
		}
		if err := w.openShards(false); err == nil {
			return w.removeStray()
		}
		w.closeFiles()
		w.done = map[int]unitStats{}
	}
	// Start over: nothing of an earlier run is trusted.
	ents, err := os.ReadDir(w.dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Name() != journalName {
			if err := os.RemoveAll(filepath.Join(w.dir, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := w.log.Reset(w.plan.stamp); err != nil {
		return err
	}
	return w.openShards(true)
}

// removeStray removes from a resumed partial directory what a killed run
// may have left besides the shards and the journal (temp files of the
// small files written last, or those files themselves: they are written
// again).
func (w *dirWriter) removeStray() error {
	keep := map[string]bool{journalName: true}
	for _, s := range w.plan.shards {
		keep[s.name] = true
	}
	ents, err := os.ReadDir(w.dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !keep[e.Name()] {
			if err := os.RemoveAll(filepath.Join(w.dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

func (w *dirWriter) openShards(create bool) error {
	// A resumed shard whose units are all durable is only read (hashed):
	// told to a caller (ShardDone), it may be a read-only blob by now.
	var written map[int]bool
	if !create {
		written = map[int]bool{}
		for i := range w.plan.shards {
			written[i] = true
		}
		for k := range w.plan.units {
			if _, ok := w.done[k]; !ok {
				for _, i := range w.shardsOf(k) {
					written[i] = false
				}
			}
		}
	}
	for i := range w.plan.shards {
		sh := &w.plan.shards[i]
		open := resumeShard
		switch {
		case create:
			open = createShard
		case written[i]:
			open = readShard
		}
		f, err := open(filepath.Join(w.dir, sh.name), sh)
		if err != nil {
			return err
		}
		w.files = append(w.files, f)
	}
	return nil
}

// follow sets up a hash follower per shard: the regions the units write
// there, in file order (weight, scales and biases of one tensor are three
// regions of each of its units; the header is in the file already).
func (w *dirWriter) follow() error {
	p := w.plan
	regions := make([][]hashfollow.Region, len(p.shards))
	for k, u := range p.units {
		t := p.Tensors[u.t]
		offs := t.outOffsets(u)
		for j, o := range t.outs {
			sh := &p.shards[o.shard]
			start := int64(len(sh.hdr)) + sh.infos[o.info].Begin + offs[j]
			regions[o.shard] = append(regions[o.shard], hashfollow.Region{Start: start, Unit: k})
		}
	}
	for i := range p.shards {
		rs := regions[i]
		slices.SortStableFunc(rs, func(a, b hashfollow.Region) int { return cmp.Compare(a.Start, b.Start) })
		f := w.files[i]
		hf, err := hashfollow.New(f.f, []int64{p.shards[i].size}, rs, len(p.units), func(int) string { return f.path })
		if err != nil {
			return err
		}
		w.hfs = append(w.hfs, hf)
	}
	w.left, w.hashed, w.told = make([]int, len(p.shards)), make([]bool, len(p.shards)), make([]bool, len(p.shards))
	for k := range p.units {
		if _, ok := w.done[k]; !ok {
			for _, i := range w.shardsOf(k) {
				w.left[i]++
			}
		}
	}
	for k := range w.done {
		w.written(k)
	}
	return nil
}

// shardsOf is the shards unit k writes, each once.
func (w *dirWriter) shardsOf(k int) []int {
	var out []int
	for _, o := range w.plan.Tensors[w.plan.units[k].t].outs {
		if !slices.Contains(out, o.shard) {
			out = append(out, o.shard)
		}
	}
	return out
}

// shardWritten notes that unit k's bytes are written (unitDone, pending
// journaling) and returns the shards now ready to be told: each of its
// units written and its follower done.
func (w *dirWriter) shardWritten(k int) []int {
	if w.left == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var ready []int
	for _, i := range w.shardsOf(k) {
		w.left[i]--
		if w.readyLocked(i) {
			ready = append(ready, i)
		}
	}
	return ready
}

// shardHashed notes that shard i's follower is done; it returns whether
// the shard is ready to be told.
func (w *dirWriter) shardHashed(i int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.hashed[i] = true
	return w.readyLocked(i)
}

func (w *dirWriter) readyLocked(i int) bool {
	if w.left[i] == 0 && w.hashed[i] && !w.told[i] {
		w.told[i] = true
		return true
	}
	return false
}

// tellShard makes shard i's bytes durable and its units journaled (with
// every unit written so far: flush), then calls done.
func (w *dirWriter) tellShard(i int, done func(path, name string, sum FileSum) error) error {
	w.tell.Lock()
	defer w.tell.Unlock()
	if w.tellErr != nil {
		return w.tellErr // the run fails: no shard is told after that
	}
	if err := w.flush(); err != nil {
		return err
	}
	sh := &w.plan.shards[i]
	w.tellErr = done(w.files[i].path, sh.name, FileSum{SHA256: w.hfs[i].Sums()[0], Size: sh.size})
	return w.tellErr
}

// written tells the hash followers of the shards unit k writes that its
// bytes are in them.
func (w *dirWriter) written(k int) {
	if w.hfs == nil {
		return
	}
	for _, o := range w.plan.Tensors[w.plan.units[k].t].outs {
		w.hfs[o.shard].Written(k)
	}
}

// closeFiles closes the shards as they are (an abandoned run's, or a
// resume's that does not match the plan).
func (w *dirWriter) closeFiles() {
	for _, f := range w.files {
		f.Abort()
	}
	w.files = nil
}

// abandon keeps what is durable for a resume.
func (w *dirWriter) abandon() {
	w.flush()
	w.closeFiles()
	w.log.Close()
}

// unitDone records a written unit; about once a second the shard files
// are fsynced and the units written before are journaled, by a goroutine
// of its own so that the worker goes on converting while the disk writes
// (a failed flush keeps its units pending: the final flush tries again).
func (w *dirWriter) unitDone(k int, st unitStats) {
	w.mu.Lock()
	if w.pending == nil {
		w.pending = map[int]unitStats{}
	}
	w.pending[k] = st
	due := time.Since(w.last) > w.every
	if due {
		w.last = time.Now()
	}
	w.mu.Unlock()
	if due {
		w.bg.Go(func() { w.flush() })
	}
}

func (w *dirWriter) flush() error {
	w.flushMu.Lock()
	defer w.flushMu.Unlock()
	w.mu.Lock()
	units := w.pending
	w.pending = nil
	w.mu.Unlock()
	if len(units) == 0 {
		return nil
	}
	err := func() error {
		for _, f := range w.files {
			if err := f.Sync(); err != nil {
				return err
			}
		}
		keys := make([]int, 0, len(units))
		for k := range units {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		es := make([]journal.Entry, len(keys))
		for i, k := range keys {
			es[i] = journal.Entry{Unit: units[k].encode(k)}
		}
		return w.log.Append(es...)
	}()
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		for k, v := range units {
			if w.pending == nil {
				w.pending = map[int]unitStats{}
			}
			w.pending[k] = v
		}
		return err
	}
	for k, v := range units {
		w.done[k] = v
	}
	return nil
}

// run converts every unit not yet durable.
func (w *dirWriter) run(ctx context.Context, o QuantizeRunOptions) error {
	p := w.plan
	jobs := o.Jobs
	if jobs <= 0 {
		jobs = runtime.GOMAXPROCS(0)
	}
	var todo []int
	for k, u := range p.units {
		if _, ok := w.done[k]; ok {
			if o.Progress != nil {
				t := p.Tensors[u.t]
				o.Progress(unitSrcBytes(t, u))
			}
			continue
		}
		todo = append(todo, k)
	}
	defer w.bg.Wait() // before abandon or finish touch the files
	g, gctx := errgroup.WithContext(ctx)
	tell := func(shards ...int) error {
		if o.ShardDone == nil {
			return nil
		}
		for _, i := range shards {
			if err := w.tellShard(i, o.ShardDone); err != nil {
				return err
			}
		}
		return nil
	}
	for i, hf := range w.hfs {
		g.Go(func() error {
			if err := hf.Run(gctx); err != nil {
				return err
			}
			if w.shardHashed(i) {
				return tell(i)
			}
			return nil
		})
	}
	next := make(chan int)
	g.Go(func() error {
		defer close(next)
		for _, k := range todo {
			select {
			case next <- k:
			case <-gctx.Done():
				return gctx.Err()
			}
		}
		return nil
	})
	for range jobs {
		g.Go(func() error {
			// A core held from the first unit to the last, offered to
			// work of a higher priority between units.
			core, err := o.Cores.Hold(gctx)
			if err != nil {
				return err
			}
			defer core.Done()
			var b unitBufs
			for k := range next {
				if err := gctx.Err(); err != nil {
					return err
				}
				if err := core.Yield(gctx); err != nil {
					return err
				}
				u := p.units[k]
				t := p.Tensors[u.t]
				st, err := w.convert(t, u, &b)
				if err != nil {
					return err
				}
				w.written(k)
				if o.UnitDone != nil {
					o.UnitDone(t.Name, u.r0, u.r1)
				}
				w.unitDone(k, st)
				if o.Progress != nil {
					o.Progress(unitSrcBytes(t, u))
				}
				if ready := w.shardWritten(k); len(ready) > 0 {
					// Its fsyncs and the caller's hand-over are no
					// core's work: the core goes to others meanwhile.
					core.Pause()
					err := tell(ready...)
					if err == nil {
						err = core.Resume(gctx)
					}
					if err != nil {
						return err
					}
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	w.bg.Wait()
	return w.flush()
}

func unitSrcBytes(t *TensorPlan, u unit) int64 {
	return (u.r1 - u.r0) * t.cols * int64(t.src.dtype.Bits()/8)
}

// unitBufs is one worker's memory, reused from unit to unit.
type unitBufs struct {
	raw, out, wq, sc, bi []byte
	vals, deq            []float32
}

func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

// readRows reads the source bytes of rows [r0, r1) into dst.
func readRows(t *TensorPlan, r0 int64, dst []byte) error {
	off := r0 * t.cols * int64(t.src.dtype.Bits()/8)
	for _, s := range t.src.spans {
		if len(dst) == 0 {
			break
		}
		if off >= s.n {
			off -= s.n
			continue
		}
		n := min(int64(len(dst)), s.n-off)
		if _, err := s.loc.Section().ReadAt(dst[:n], s.off+off); err != nil {
			return fmt.Errorf("%s: tensor %q at offset %d: %w", s.loc.Shard.Path, s.srcName, s.loc.Shard.DataOffset()+s.loc.Info.Begin+s.off+off, err)
		}
		dst = dst[n:]
		off = 0
	}
	if len(dst) != 0 {
		return fmt.Errorf("tensor %q: %w", t.Name, io.ErrUnexpectedEOF)
	}
	return nil
}

// convert makes one unit's output bytes and writes them at their offsets.
func (w *dirWriter) convert(t *TensorPlan, u unit, b *unitBufs) (unitStats, error) {
	n := (u.r1 - u.r0) * t.cols
	sdt := t.src.dtype
	b.raw = grow(b.raw, int(n)*sdt.Bits()/8)
	if err := readRows(t, u.r0, b.raw); err != nil {
		return unitStats{}, err
	}
	off := t.outOffsets(u)
	if !t.Quantized() && !t.Shift && t.DType == sdt {
		return unitStats{}, w.writeOut(t, 0, off[0], b.raw)
	}
	b.vals = grow(b.vals, int(n))
	if err := tensor.ToF32(sdt, b.vals, b.raw); err != nil {
		return unitStats{}, err
	}
	if t.Shift {
		// sanitize's v + 1.0 in the source dtype: float32 sum, rounded.
		for i, v := range b.vals {
			b.vals[i] = tensor.RoundTo(sdt, v+1)
		}
	}
	if t.DType != sdt {
		for i, v := range b.vals {
			b.vals[i] = tensor.RoundTo(t.DType, v)
		}
	}
	if !t.Quantized() {
		b.out = grow(b.out, int(n)*t.DType.Bits()/8)
		if err := tensor.FromF32(t.DType, b.out, b.vals); err != nil {
			return unitStats{}, err
		}
		return unitStats{}, w.writeOut(t, 0, off[0], b.out)
	}
	rows := u.r1 - u.r0
	groups := rows * t.cols / int64(t.GroupSize)
	width := int64(t.DType.Bits() / 8)
	b.wq = grow(b.wq, int(n)*t.Bits/8)
	b.sc = grow(b.sc, int(groups*width))
	b.bi = grow(b.bi, int(groups*width))
	if err := AffineQuantize(b.vals, int(t.cols), t.GroupSize, t.Bits, t.DType, b.wq, b.sc, b.bi); err != nil {
		return unitStats{}, w.valueErr(t, u, err)
	}
	for k, data := range [][]byte{b.wq, b.sc, b.bi} {
		if err := w.writeOut(t, k, off[k], data); err != nil {
			return unitStats{}, err
		}
	}
	return quantErr(b.vals, b.wq, b.sc, b.bi, t.GroupSize, t.Bits, t.DType, &b.deq), nil
}

// outOffsets are where unit u's bytes go in each output of t (weight,
// then scales and biases when quantized): offsets into their bodies. The
// one place that says it, for convert and for the hash followers.
func (t *TensorPlan) outOffsets(u unit) [3]int64 {
	if !t.Quantized() {
		return [3]int64{u.r0 * t.cols * int64(t.DType.Bits()/8)}
	}
	groups := u.r0 * (t.cols / int64(t.GroupSize)) * int64(t.DType.Bits()/8)
	return [3]int64{u.r0 * t.cols * int64(t.Bits) / 8, groups, groups}
}

// quantErr sums a unit's quantization error: each element's q·scale+bias
// (the codes read back from wq, the stored scale and bias widened to
// float32, the arithmetic in float32) against the value quantized. It is
// a report figure, not mx.dequantize's bytes (AffineDequantize rounds each
// step to the dtype), and costs a fraction of the quantization. Groups go
// in pairs: each group's sums are its own float32 chains, so two groups
// side by side halve the wait on the additions and give the same figures.
func quantErr(vals []float32, wq, sc, bi []byte, gs, bits int, dt tensor.DType, tmp *[]float32) unitStats {
	ng := len(vals) / gs
	*tmp = grow(*tmp, 2*ng)
	scale, bias := (*tmp)[:ng], (*tmp)[ng:]
	tensor.ToF32(dt, scale, sc)
	tensor.ToF32(dt, bias, bi)
	groupBytes := gs * bits / 8
	var st unitStats
	add := func(sqErr, sq float32, maxBits uint32) {
		st.sqErr += float64(sqErr)
		st.sq += float64(sq)
		st.maxErr = max(st.maxErr, float64(math.Float32frombits(maxBits)))
	}
	var codes [2][128]float32 // two groups' codes (group sizes are at most 128)
	for g := 0; g < ng; g += 2 {
		h := min(g+1, ng-1) // an odd last group is paired with itself, counted once
		c0, c1 := codes[0][:gs], codes[1][:gs]
		unpackCodes(c0, wq[g*groupBytes:(g+1)*groupBytes], bits)
		unpackCodes(c1, wq[h*groupBytes:(h+1)*groupBytes], bits)
		s0, b0, s1, b1 := scale[g], bias[g], scale[h], bias[h]
		x0, x1 := vals[g*gs:(g+1)*gs], vals[h*gs:(h+1)*gs]
		var sqErr0, sq0, sqErr1, sq1 float32
		var max0, max1 uint32 // |d| as bits: non-negative floats order as their bits
		for i, v := range x0 {
			w := x1[i]
			d0 := c0[i]*s0 + b0 - v
			d1 := c1[i]*s1 + b1 - w
			sqErr0 += d0 * d0
			sqErr1 += d1 * d1
			sq0 += v * v
			sq1 += w * w
			max0 = max(max0, math.Float32bits(d0)&^(1<<31))
			max1 = max(max1, math.Float32bits(d1)&^(1<<31))
		}
		add(sqErr0, sq0, max0)
		if h != g {
			add(sqErr1, sq1, max1)
		}
	}
	return st
}

// valueErr names the tensor and the rows of a unit the quantizer refused
// (a NaN or infinite weight).
func (w *dirWriter) valueErr(t *TensorPlan, u unit, err error) error {
	path := w.plan.Src
	if len(t.src.spans) > 0 {
		path = t.src.spans[0].loc.Shard.Path
	}
	return errf(path, t.Name, err, "rows %d…%d (of %s): %v", u.r0, u.r1-1, strings.Join(t.Source, ", "), err)
}

// writeOut writes data at offset off of output tensor k of t (0 weight,
// 1 scales, 2 biases).
func (w *dirWriter) writeOut(t *TensorPlan, k int, off int64, data []byte) error {
	o := t.outs[k]
	return w.files[o.shard].writeTensorAt(o.info, off, data)
}

// finish writes the small files, drops the journal and renames the
// partial directory into place.
func (w *dirWriter) finish(ctx context.Context, out string) error {
	p := w.plan
	for _, f := range w.files {
		if err := f.Close(); err != nil {
			return err
		}
	}
	w.files = nil
	small := map[string][]byte{safetensors.IndexName: p.index, "config.json": p.config, "README.md": p.readme}
	for name, data := range small {
		if err := fsutil.WriteFileAtomic(filepath.Join(w.dir, name), data, 0o644); err != nil {
			return err
		}
	}
	for _, name := range p.copies {
		if _, _, err := fsutil.CopyAtomic(ctx, filepath.Join(w.dir, name), filepath.Join(p.Src, name), nil); err != nil {
			return err
		}
	}
	if err := w.log.Remove(); err != nil {
		return err
	}
	return commitDir(w.dir, out)
}

// results sums each tensor's unit statistics in unit order (so the
// figures do not depend on the worker count).
func (w *dirWriter) results() []TensorResult {
	p := w.plan
	out := make([]TensorResult, 0, len(p.Tensors))
	for _, t := range p.Tensors {
		r := TensorResult{Name: t.Name, Module: t.Module(), DType: t.DType, Shape: t.Shape, Bits: t.Bits, GroupSize: t.GroupSize, Bytes: t.Bytes, MTP: t.MTP}
		if t.Quantized() {
			var sum unitStats
			for k := t.unit0; k < t.unit0+t.units; k++ {
				st := w.done[k]
				sum.sqErr += st.sqErr
				sum.sq += st.sq
				sum.maxErr = max(sum.maxErr, st.maxErr)
			}
			n := float64(t.rows * t.cols)
			rmse := math.Sqrt(sum.sqErr / n)
			rel := 0.0
			if sum.sq > 0 {
				rel = math.Sqrt(sum.sqErr / sum.sq)
			}
			r.RMSE, r.MaxAbsErr, r.RelRMSE = &rmse, &sum.maxErr, &rel
		}
		out = append(out, r)
	}
	return out
}
