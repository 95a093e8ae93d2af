package pipeline

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/merge"
)

// mergeStage merges a PEFT LoRA/DoRA/rsLoRA adapter into a base checkpoint
// with the merge package (PEFT merge_and_unload semantics, streaming).
//
//	merge: { base: base, adapter: adapter, dtype: bf16, allow_unused: false, allow_nonfinite: false }
//
// base and adapter name earlier stages (usually imports); dtype (bf16, f16,
// f32) is the merged tensors' dtype, default each base tensor's own;
// allow_nonfinite merges even where the adapter brings NaN or Inf (enters
// the stage key only when set, so keys of existing pipelines stay). The
// merge writes into the stage's work dir inside the store (merge resumes
// there after a kill, from its own shard journal), and every file is then
// adopted into the blobs by hard link under the digest merge computed while
// writing it.
type mergeStage struct {
	Base        string `json:"base"`
	Adapter     string `json:"adapter"`
	DType       string `json:"dtype,omitempty"`
	AllowUnused bool   `json:"allow_unused,omitempty"`
	// omitempty: absent when false, so stage keys made before the option
	// existed do not change.
	AllowNonFinite bool `json:"allow_nonfinite,omitempty"`
}

var _ Stage = (*mergeStage)(nil)

func newMerge(p *Params) (Stage, error) {
	s := &mergeStage{}
	var err error
	if s.Base, err = p.Ref("base", true); err != nil {
		return nil, err
	}
	if s.Adapter, err = p.Ref("adapter", true); err != nil {
		return nil, err
	}
	dt, err := p.String("dtype", false)
	if err != nil {
		return nil, err
	}
	d, err := merge.ParseDType(dt)
	if err != nil {
		return nil, p.Errorf("dtype", "%v", err)
	}
	s.DType = strings.ToLower(string(d)) // bf16, f16, f32 or "", as keys have always had it
	if s.AllowUnused, err = p.Bool("allow_unused", false); err != nil {
		return nil, err
	}
	if s.AllowNonFinite, err = p.Bool("allow_nonfinite", false); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *mergeStage) Params() any { return s }

// inventory makes the merge plan from the inputs' headers and configs.
func (s *mergeStage) inventory(env *Env) (*merge.Plan, error) {
	base, adapter := env.Input(s.Base), env.Input(s.Adapter)
	if base == nil || adapter == nil {
		return nil, fmt.Errorf("merge: inputs %q and %q not given", s.Base, s.Adapter)
	}
	dt, _ := merge.ParseDType(s.DType)
	return merge.Inventory(base.Dir, adapter.Dir, merge.PlanOptions{AllowUnused: s.AllowUnused, DType: dt})
}

func (s *mergeStage) Run(ctx context.Context, env *Env) (*Result, error) {
	plan, err := s.inventory(env)
	if err != nil {
		return nil, err
	}
	defer plan.Close()
	work, err := env.WorkDir()
	if err != nil {
		return nil, err
	}
	// A work dir holding files but no merge journal is a run killed after
	// its merge finished (the journal goes last), before the record: that
	// merge is not resumable, so it starts afresh.
	if _, err := os.Stat(filepath.Join(work, merge.JournalName)); err != nil {
		if err := os.RemoveAll(work); err != nil {
			return nil, err
		}
		if work, err = env.WorkDir(); err != nil {
			return nil, err
		}
	}
	env.Progress.SetTotal(plan.TotalBytes)
	var last int64
	opt := merge.ExecOptions{Jobs: env.Jobs, AllowNonFinite: s.AllowNonFinite, Cores: env.Cores}
	if env.SharesEarly() && !mergeNoAhead {
		// Sharing it: each shard's digest is worked out ahead of its
		// bytes, on the cores the merge's disk-bound writes leave idle
		// (its workers take the cores first: the pass ahead never slows
		// a merge that keeps them busy), and the shard uploads as it is
		// written (ShareAhead).
		ah := newMergeAhead(ctx, env)
		defer ah.stop()
		opt.ShardOpened = ah.opened
		go ah.run(plan, work, merge.ExecOptions{Jobs: aheadJobs(env), AllowNonFinite: opt.AllowNonFinite, Cores: env.Cores.Idle()})
	}
	res, err := merge.Execute(ctx, plan, work, merge.ExecOptions{
		Jobs:           opt.Jobs,
		AllowNonFinite: opt.AllowNonFinite,
		ShardOpened:    opt.ShardOpened,
		Cores:          opt.Cores,
		Progress: func(done, total int64) {
			env.Progress.Add(done - last)
			last = done
		},
		// Each shard is a blob as soon as it is whole: in a run that
		// shares the merge, it is stored while the others are written.
		ShardDone: func(f merge.FileDigest) error {
			if mergeShardWhole != nil {
				mergeShardWhole(f.Name)
			}
			d, err := f.Digest()
			if err != nil {
				return fmt.Errorf("merge output %s: %w", f.Name, err)
			}
			_, _, err = env.AdoptKnown(filepath.Join(work, filepath.FromSlash(f.Name)), d, f.Size)
			if err == nil && mergeShardDone != nil {
				mergeShardDone(f.Name)
			}
			return err
		},
	})
	if err != nil {
		return nil, err
	}
	out := &Result{}
	for _, f := range res.Files {
		d, err := f.Digest()
		if err != nil {
			return nil, fmt.Errorf("merge output %s: %w", f.Name, err)
		}
		if _, _, err := env.AdoptKnown(filepath.Join(work, filepath.FromSlash(f.Name)), d, f.Size); err != nil {
			return nil, err
		}
		out.Outputs = append(out.Outputs, manifest.Output{Path: filepath.ToSlash(f.Name), Digest: d, Size: f.Size})
	}
	return out, nil
}

// mergeShardDone, set by tests only, is told of each shard the merge
// made a blob, while it writes the others.
var mergeShardDone func(name string)

// Plan makes the merge plan from the base's and adapter's headers and
// configs (no tensor data): a missing target, an adapter that does not fit
// the base or unused adapter tensors are refused here, before any stage
// of the run starts.
func (s *mergeStage) Plan(ctx context.Context, env *Env) (*StagePlan, error) {
	plan, err := s.inventory(env)
	if err != nil {
		return nil, err
	}
	defer plan.Close()
	// Each worker, and the writer, hold a block of whole rows (at least
	// merge.DefaultBlockElems elements) at about 16 bytes an element (the
	// raw bytes, the base and delta rows in float32, the output); one
	// module's A and B factors in float32; and a constant.
	var width, factors int64
	for _, m := range plan.Modules {
		width = max(width, m.Cols)
		factors = max(factors, (m.Rows+m.Cols)*int64(m.Rank)*4)
	}
	block := max(width, merge.DefaultBlockElems) * 16
	mem := int64(max(env.Jobs, 1)+1)*block + 2*factors + 64<<20
	if env.Shared() {
		// The pass ahead of a shared merge's writes: its workers'
		// blocks and its own factors.
		mem += int64(aheadJobs(env)+1)*block + 2*factors
	}
	return &StagePlan{
		Summary: fmt.Sprintf("%d modules into %d shards, %s", len(plan.Modules), len(plan.Shards), FormatBytes(plan.TotalBytes)),
		Memory:  mem,
	}, nil
}

// aheadJobs is the workers of a shared merge's pass ahead: half the
// merge's (and their row-block buffers), as many shards at once as that
// many workers get (one per four), still well ahead of the writes, each
// shard's hash being the limit.
func aheadJobs(env *Env) int {
	jobs := env.Jobs
	if jobs <= 0 {
		jobs = runtime.NumCPU()
	}
	return max(1, jobs/2)
}

// mergeAhead stores a shared merge's shards while they are written: the
// digest of each, from merge.Digests, and the partial file Execute opens
// for it (ShardOpened), once both are known, go to Env.ShareAhead.
type mergeAhead struct {
	env    *Env
	ctx    context.Context
	cancel func()
	done   chan struct{}
	mu     sync.Mutex
	sums   map[string]merge.FileDigest
	files  map[string]*growingFile
}

func newMergeAhead(ctx context.Context, env *Env) *mergeAhead {
	ctx, cancel := context.WithCancel(ctx)
	return &mergeAhead{env: env, ctx: ctx, cancel: cancel, done: make(chan struct{}),
		sums: map[string]merge.FileDigest{}, files: map[string]*growingFile{}}
}

// run works out the digests; an error (the merge's own, or a stop) only
// means no more shards go up ahead.
func (a *mergeAhead) run(plan *merge.Plan, work string, opt merge.ExecOptions) {
	defer close(a.done)
	// A shard under its name in the work dir was finished by an earlier
	// run: the merge keeps it (and hands it over whole), not written.
	done := func(name string) bool {
		_, err := os.Lstat(filepath.Join(work, filepath.FromSlash(name)))
		return err == nil
	}
	err := merge.Digests(a.ctx, plan, opt, done, func(f merge.FileDigest) error {
		a.mu.Lock()
		a.sums[f.Name] = f
		a.mu.Unlock()
		a.start(f.Name)
		return nil
	})
	if err != nil && a.ctx.Err() == nil {
		a.env.Log.Debug("merge: no digests ahead of the shards", "err", err)
	}
}

// opened is merge.ExecOptions.ShardOpened: the partial file, opened here
// (it is renamed when whole: an open file stays readable).
func (a *mergeAhead) opened(name, path string, flushed func() int64) {
	f, err := os.Open(path)
	if err != nil {
		a.env.Log.Debug("merge: a shard not stored ahead", "shard", name, "err", err)
		return
	}
	a.mu.Lock()
	if old := a.files[name]; old != nil {
		// The shard starts over: its upload reading the old file fails
		// (the blob goes up early once whole: earlyShare.start); none
		// reads the new one.
		old.Close()
		f.Close()
		a.mu.Unlock()
		return
	}
	a.files[name] = &growingFile{ctx: a.ctx, f: f, flushed: flushed}
	a.mu.Unlock()
	a.start(name)
}

// start stores shard name ahead once its digest and file are known.
func (a *mergeAhead) start(name string) {
	a.mu.Lock()
	sum, ok := a.sums[name]
	g := a.files[name]
	a.mu.Unlock()
	if !ok || g == nil {
		return
	}
	d, err := sum.Digest()
	if err != nil {
		return
	}
	a.mu.Lock()
	if a.files[name] != g || g.handed || g.isClosed() {
		a.mu.Unlock()
		return
	}
	g.handed, g.size = true, sum.Size
	a.mu.Unlock()
	if !a.env.ShareAhead(d, sum.Size, g) {
		g.Close()
		return
	}
	if mergeAheadStarted != nil {
		mergeAheadStarted(name)
	}
}

// stop ends the pass ahead: the merge returned. An upload still waiting
// for bytes of a shard the merge did not finish then fails (the shard is
// not a blob); one of a finished shard reads on, and closes its file.
func (a *mergeAhead) stop() {
	a.cancel()
	<-a.done
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, g := range a.files {
		if !g.handed {
			g.Close()
		}
	}
}

// growingFile reads a shard's partial file as the merge writes it: a
// ReadAt waits until the bytes it asks for are in the file.
type growingFile struct {
	ctx     context.Context
	f       *os.File
	flushed func() int64
	size    int64 // set with handed, before the upload reads
	handed  bool  // to an upload (mergeAhead.mu), which closes it
	mu      sync.Mutex
	closed  bool
}

func (g *growingFile) ReadAt(p []byte, off int64) (int, error) {
	end := min(off+int64(len(p)), g.size)
	for g.flushed() < end {
		if g.isClosed() {
			// The shard started over, or the merge stopped.
			return 0, os.ErrClosed
		}
		select {
		case <-g.ctx.Done():
			return 0, g.ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return 0, os.ErrClosed
	}
	n, err := g.f.ReadAt(p, off)
	if int64(n) < end-off && (err == nil || err == io.EOF) {
		// Flushed, yet not in the file: it was cut (started over).
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (g *growingFile) isClosed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// Close closes the file (once); a read after it fails.
func (g *growingFile) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.closed = true
		return g.f.Close()
	}
	return nil
}

// mergeNoAhead, set by tests only, turns the pass ahead off: each shard
// then goes up once whole.
var mergeNoAhead bool

// mergeAheadStarted and mergeShardWhole, set by tests only, are told of
// each shard stored ahead of its bytes, and of each shard whole before it
// is handed over.
var mergeAheadStarted, mergeShardWhole func(name string)
