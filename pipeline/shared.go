package pipeline

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ferry-llm/ferry/internal/cpushare"
	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/store"
	"github.com/ferry-llm/ferry/store/local"
	s3store "github.com/ferry-llm/ferry/store/s3"
	"github.com/ferry-llm/ferry/transfer"
)

// A pipeline on a shared store (store: s3://BUCKET/PREFIX) runs against
// two stores: the shared one, where finished stages are records and blobs
// every machine reads, and this machine's local store, its cache (the
// spec's Store: views, work dirs, resume journals, the blobs it made or
// fetched, import stamps). Stages see only the local one; the runner moves
// stages between them:
//
//   - a stage whose key has a record in the shared store is not run: its
//     outputs are fetched (ranged reads, verified before use) into the
//     cache and it is skipped, naming the machine that made it;
//   - otherwise the runner takes the stage key's lease, so that of the
//     machines that want the stage one makes it and the others wait
//     ("being made on HOST, lease until T"); a waiter that gets the lease
//     looks for the record again and, finding it, skips;
//   - the holder runs the stage under the lease (a lost lease cancels it;
//     what it wrote stays resumable), stores its outputs as blobs, commits
//     the record, points refs/pipelines/<pipeline>/<stage> at it and only
//     then releases the lease. This happens behind the run: the stages
//     after it start at once on the local copy;
//   - a stage up to date in the cache whose record the shared store lacks
//     is shared the same way (a store seeded late, or wiped).
//
// Imports stay on the machine: they read this machine's files (their
// record holds paths and stamps) and their bytes are usually the base
// model every machine already has; what the stages after them make is
// keyed by the imported bytes' digests, so it is shared whatever
// directory each machine imported from.

// DefaultLeaseTTL is a stage lease's ttl when neither --lease-ttl nor
// lease_ttl: says: a machine that dies holding one is taken over this long
// after its last renewal.
const DefaultLeaseTTL = 2 * time.Minute

// sharedStore is the shared store of a run.
type sharedStore struct {
	s   *store.Store
	ttl time.Duration
	// poll is how often a waiter looks at a held lease again.
	poll time.Duration

	// slots bounds the blobs uploading at once, of all stages (each holds
	// about part size × (parallel + 1) bytes while it uploads).
	slots chan struct{}
	// fetches bounds the blobs fetched at once, of all stages (each
	// holds part size × (parallel + 1) bytes while it is fetched).
	fetches chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	errs    []error
	// failed: why each stage that failed to share did (StageReport.NotShared);
	// cut: those the run's interrupt stopped.
	failed map[string]string
	cut    map[string]bool
}

// cutShort says whether stage's sharing was stopped by the interrupt.
func (sh *sharedStore) cutShort(stage string) bool {
	if sh == nil {
		return false
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.cut[stage]
}

// notShared is why stage failed to be shared ("" if it did not fail).
func (sh *sharedStore) notShared(stage string) string {
	if sh == nil {
		return ""
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.failed[stage]
}

// publishers is how many blobs are uploaded at once, of one stage or
// several: on a 16-core host, four stages at a time instead of two took
// BenchmarkJarvis2Shared's s3 run from 1.88× to 1.77× the local one, at
// the same peak RSS.
const publishers = 4

// openShared opens the shared store of spec (nil when it has none),
// probing its conditional writes: a server that ignores them is refused
// before anything runs.
func openShared(ctx context.Context, spec *Spec, opts Options, cores *cpushare.Gate) (*sharedStore, error) {
	if spec.Shared == "" {
		return nil, nil
	}
	b, err := sharedBackend(ctx, spec.Shared)
	if err != nil {
		return nil, err
	}
	if wrapShared != nil {
		b = wrapShared(b)
	}
	parallel := min(max(runtime.NumCPU()/2, store.DefaultParallel), 8)
	s, err := store.Open(ctx, b, store.Options{
		CacheDir: filepath.Join(spec.Store, "shared"),
		Host:     opts.Host,
		// Ranged reads in flight per blob fetched, and parts per blob
		// uploaded while others are: the stages' cores are busy too, and
		// each part is hashed as it goes. The blobs uploading share
		// publishers × that many parts (16 MiB each, the memory they
		// hold); one uploading alone, the last a run waits for, has up to
		// twice that many moving (the parts of a 4 GiB blob went to a
		// versitygw on a 16-core host at 1.5 GB/s with 8 in flight, at
		// 2.6 GB/s with 16: store/s3's BenchmarkBlob).
		Parallel:       parallel,
		UploadParallel: 2 * parallel,
		UploadInFlight: publishers * parallel,
		// A part takes a core before the stages do: the stages' cores are
		// handed out by priority, and an upload that must wait for them
		// ends, and has its parts joined, only after the last stage.
		Cores: cores,
		// The cache is this run's alone (its lock): a lease a killed
		// earlier run on it held is taken over at once, not after its ttl.
		ResumeLeases: true,
	})
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", spec.Shared, err)
	}
	ttl := opts.LeaseTTL
	if ttl == 0 {
		ttl = spec.LeaseTTL
	}
	if ttl == 0 {
		ttl = DefaultLeaseTTL
	}
	if min := s.MinLeaseTTL(); ttl < min {
		return nil, errkind.Errorf(errkind.Usage, "store %s: lease ttl %v is too short: at least %v there (its dates have whole seconds)", spec.Shared, ttl, min)
	}
	return &sharedStore{s: s, ttl: ttl, poll: min(max(ttl/8, 50*time.Millisecond), 2*time.Second), slots: make(chan struct{}, publishers), fetches: make(chan struct{}, publishers)}, nil
}

// wrapShared, set by tests only, wraps the storage of a run's shared
// store (a fault on its way here).
var wrapShared func(store.Backend) store.Backend

// sharedBackend is the storage of the shared store url: an S3 prefix, or a
// directory (file:///DIR) on a file system the machines mount. A lease
// there is judged by the reading machine's clock against the file's
// modification time, so those machines' clocks must agree (NTP).
func sharedBackend(ctx context.Context, url string) (store.Backend, error) {
	if dir, ok := strings.CutPrefix(url, "file://"); ok {
		// A pipeline's own store keeps this machine's facts beside its
		// objects, and its gc (under its lock, pruning records no stage of
		// its own points at) would take another machine's outputs.
		if _, err := os.Stat(filepath.Join(dir, "manifest.json")); err == nil {
			return nil, errkind.Errorf(errkind.Usage, "store %s: %s is a pipeline's own store (it has manifest.json), not one several machines share: seed one with 'ferry store copy %s DIR' and name file://DIR (or an s3:// bucket) on every machine", url, dir, dir)
		}
		b, err := local.New(dir)
		if err != nil {
			return nil, err
		}
		return b, nil
	}
	b, err := s3store.Open(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", url, err)
	}
	return b, nil
}

// openSharedRead opens the shared store of spec for plan and status,
// which write nothing: no probe, and a store not made yet is none.
func openSharedRead(ctx context.Context, spec *Spec) (*sharedStore, error) {
	if spec.Shared == "" {
		return nil, nil
	}
	b, err := sharedBackend(ctx, spec.Shared)
	if err != nil {
		return nil, err
	}
	s, err := store.Open(ctx, b, store.Options{CacheDir: filepath.Join(spec.Store, "shared"), SkipProbe: true, Existing: true})
	if errors.Is(err, store.ErrNoStore) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", spec.Shared, err)
	}
	return &sharedStore{s: s, ttl: DefaultLeaseTTL}, nil
}

// planShared is the input a plan sees for st when the shared store has a
// record of key: its outputs, not fetched (plan writes nothing).
func (r *runner) planShared(ctx context.Context, st *StageSpec, key string) (*Input, string, error) {
	srec, err := r.shared.s.Record(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	return r.sharedInput(st, key, srec)
}

// sharedInput is the input a plan sees for st from srec, key's record in
// the shared store, and the machine that made it.
func (r *runner) sharedInput(st *StageSpec, key string, srec *store.Record) (*Input, string, error) {
	outs := make([]manifest.Output, len(srec.Outputs))
	for i, o := range srec.Outputs {
		outs[i] = manifest.Output{Path: o.Path, Digest: o.Digest, Size: o.Size}
	}
	return &Input{Stage: st.Name, Dir: r.spec.ViewDir(st), Outputs: outs, Digest: manifest.OutputsDigest(outs), Key: key, fetched: true}, srec.Host, nil
}

// outsideInput is what a stage outside the selection, with no record here,
// stands for in the shared store.
type outsideInput struct {
	in   *Input
	host string // the machine that made in
	// Without in: why there is none, and the machine holding the lease of
	// the key this file gives the stage (making) and until when.
	why    string
	making string
	until  time.Time
	// local: a stage no machine but this one can make (an import of this
	// machine's files) that has no record here: the stages after it
	// cannot be keyed here.
	local bool
}

// sharedOutside is what st (not an import), outside the selection and
// with no usable record here, stands for in the shared store. With known
// (ins are all its inputs) it is the record of the key this file gives
// st, or a machine making that key; never another key's, whatever the
// stage's ref names (the latest run on any machine, maybe of a file with
// other parameters).
// Without (an input before it is an import of files not here: ins are
// its inputs that are known) it is the record the stage's ref names,
// when that was made with this file's kind, format version and
// parameters, from those inputs.
func (r *runner) sharedOutside(ctx context.Context, st *StageSpec, ins []Input, known bool) (outsideInput, error) {
	key, params, _, err := r.key(st, ins)
	if err != nil {
		return outsideInput{}, err
	}
	if known {
		in, host, err := r.planShared(ctx, st, key)
		if err != nil || in != nil {
			return outsideInput{in: in, host: host}, err
		}
		li, until, live, err := r.shared.s.LeaseStatus(ctx, leaseName(key))
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return outsideInput{}, err
		}
		if live {
			return outsideInput{why: fmt.Sprintf("stage %s is being made on %s (lease until %s)", st.Name, li.Holder, until.Local().Format("15:04:05")), making: li.Holder, until: until}, nil
		}
		why := fmt.Sprintf("stage %s has not run with this file's parameters and inputs, here or in %s; run it first (or drop --only/--from)", st.Name, r.spec.Shared)
		// What the latest record there differs in, for the message only.
		if _, rec, err := r.latestShared(ctx, st); err == nil && rec != nil {
			why += "; its latest record there, made on " + rec.Host + ", " + r.differs(st, rec, params, ins, "has other inputs")
		}
		return outsideInput{why: why}, nil
	}
	// Another machine making st anew (new files of an input before it)
	// points the ref at what it makes: waited for.
	if o, err := r.beingMade(ctx, st, params); err != nil || o.making != "" {
		return o, err
	}
	latest, rec, err := r.latestShared(ctx, st)
	if err != nil {
		return outsideInput{}, err
	}
	if latest == nil {
		return outsideInput{why: fmt.Sprintf("stage %s has not run yet, here or in %s; run it first (or drop --only/--from)", st.Name, r.spec.Shared)}, nil
	}
	if d := r.differs(st, rec, params, ins, ""); d != "" {
		return outsideInput{why: fmt.Sprintf("stage %s: its latest record in %s, made on %s, %s; run it here first (or drop --only/--from)", st.Name, r.spec.Shared, rec.Host, d)}, nil
	}
	return outsideInput{in: latest, host: rec.Host}, nil
}

// sourcesHere says whether what the import st reads is to be had on this
// machine: its files, or an s3:// prefix (which every machine reads).
func sourcesHere(st *StageSpec) bool {
	imp, ok := st.Stage.(*importStage)
	if !ok {
		return false
	}
	if transfer.S3Source(imp.Path) {
		return true
	}
	_, err := os.Stat(imp.Path)
	return err == nil
}

// latestShared is the record the shared store's ref of st names (nil
// when there is none, or the ref is broken), as an input and as a record.
func (r *runner) latestShared(ctx context.Context, st *StageSpec) (*Input, *manifest.Record, error) {
	ref, err := r.shared.s.GetRef(ctx, manifest.StageRef(r.spec.Name, st.Name))
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	srec, err := r.shared.s.RefRecord(ctx, ref)
	if errors.Is(err, store.ErrRefBroken) {
		// As if the store had none: the next run of that stage points it
		// again.
		r.log.Warn("the shared store's ref of a stage names no record it holds", "stage", st.Name, "err", err)
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	rec, err := manifest.FromStoreRecord(r.shared.s.String(), srec)
	if err != nil {
		return nil, nil, err
	}
	in, _, err := r.sharedInput(st, ref.Value, srec)
	return in, rec, err
}

// differs says how rec was made otherwise than this file makes st with
// params from ins (those of its inputs that are known): its kind, its
// kind's format version, its parameters or one of those inputs; same
// when none of those differ ("" for nothing).
func (r *runner) differs(st *StageSpec, rec *manifest.Record, params json.RawMessage, ins []Input, same string) string {
	switch v := r.spec.KindOf(st).Version; {
	case rec.Kind != "" && rec.Kind != st.Kind:
		return fmt.Sprintf("is of kind %s, not %s", rec.Kind, st.Kind)
	case rec.KindVersion != v:
		return fmt.Sprintf("was made by kind %s's format version %s, not %s", st.Kind, cmp.Or(rec.KindVersion, "none"), v)
	case !jsonEqual(rec.Params, params):
		return fmt.Sprintf("was made with other parameters (%s there, %s here)", clip(string(rec.Params)), clip(string(params)))
	}
	for _, in := range ins {
		for _, ri := range rec.Inputs {
			if ri.Stage == in.Stage && ri.Digest != in.Digest {
				return fmt.Sprintf("was made from another %s", in.Stage)
			}
		}
	}
	return same
}

// clip shortens s for a message.
func clip(s string) string {
	if len(s) > 160 {
		return s[:157] + "..."
	}
	return s
}

// waitSeen is the holder and end of a lease a waiter last told of.
type waitSeen struct {
	holder string
	until  time.Time
}

// news says whether a lease held by holder until until is worth a new
// event: another holder, or an end moved by a renewal. The end is
// worked out from whole-second dates, so it wanders by up to a second
// from one look to the next without the lease changing.
func (w waitSeen) news(holder string, until time.Time) bool {
	d := until.Sub(w.until)
	return holder != w.holder || d > 1500*time.Millisecond || d < -1500*time.Millisecond
}

// waitOutside is resolveOutside, waiting while another machine makes st
// (each new holder or end time an event, as a stage that waits for its
// lease tells).
func (r *runner) waitOutside(ctx context.Context, st *StageSpec, memo map[string]outsideInput) (outsideInput, error) {
	var last waitSeen
	for {
		o, err := r.resolveOutside(ctx, st, memo)
		if err != nil || o.making == "" {
			return o, err
		}
		if last.news(o.making, o.until) {
			if last.holder == "" {
				r.lifecycle("stage waiting", "stage", st.Name, "holder", o.making, "until", o.until.Format(time.RFC3339))
			}
			last = waitSeen{o.making, o.until}
			until := o.until
			r.emit(Event{Event: EventWaiting, Stage: st.Name, Kind: st.Kind, Reason: fmt.Sprintf("being made on %s, lease until %s", o.making, until.Local().Format("15:04:05")), Holder: o.making, Until: &until})
		}
		select {
		case <-time.After(r.shared.poll):
		case <-ctx.Done():
			return outsideInput{}, ctx.Err()
		}
	}
}

// resolveOutside is what st, outside the selection, is as an input: its
// record here, else what it stands for in the shared store, its own
// inputs resolved the same way first (memo: stages resolved so far). An
// input before it that is not to be had (made nowhere with this file's
// parameters) makes st none too; one being made makes st wait for it.
func (r *runner) resolveOutside(ctx context.Context, st *StageSpec, memo map[string]outsideInput) (outsideInput, error) {
	if o, ok := memo[st.Name]; ok {
		return o, nil
	}
	o, err := r.resolveOutsideOnce(ctx, st, memo)
	if err == nil && o.making == "" {
		// One being made is looked at again on the next round.
		memo[st.Name] = o
	}
	return o, err
}

func (r *runner) resolveOutsideOnce(ctx context.Context, st *StageSpec, memo map[string]outsideInput) (outsideInput, error) {
	in, ierr := r.existingInput(st)
	if ierr == nil {
		return outsideInput{in: &in}, nil
	}
	if r.shared == nil || !shareable(st) {
		// An import whose files are here is to be run here first (its
		// key is what decides every stage after it): not yet run, or its
		// files changed since.
		return outsideInput{why: ierr.Error(), local: !sourcesHere(st)}, nil
	}
	ins, known := []Input{}, true
	for _, dep := range st.Deps {
		o, err := r.resolveOutside(ctx, r.spec.Lookup(dep.Name), memo)
		switch {
		case err != nil:
			return outsideInput{}, err
		case o.in != nil:
			ins = append(ins, *o.in)
		case o.making != "":
			return o, nil // waited for, then st looked at again
		case o.local:
			known = false
		default:
			return outsideInput{why: fmt.Sprintf("stage %s reads %s: %s", st.Name, dep.Name, o.why)}, nil
		}
	}
	return r.sharedOutside(ctx, st, ins, known)
}

// shareable says whether st's records go to the shared store.
func shareable(st *StageSpec) bool { return st.Kind != "import" }

func leaseName(key string) string { return "stage/" + key }

// fromShared looks for st's key in the shared store; when a record is
// there it fetches the outputs into the local store, commits the record
// there too and returns it with the machine that made it.
func (r *runner) fromShared(ctx context.Context, st *StageSpec, d decision) (*manifest.Record, string, error) {
	srec, err := r.shared.s.Record(ctx, d.key)
	if errors.Is(err, store.ErrNotFound) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	rec, err := r.materialize(ctx, st, d.params, d.ins, srec)
	if errors.Is(err, store.ErrBlobMissing) {
		// A record whose blob is gone (deleted by hand, a bucket
		// lifecycle rule): made again here, which stores the blob again.
		if _, told := r.removedShared.Load(d.key); !told {
			r.log.Warn("the shared record names a blob that is gone: the stage is made again", "stage", st.Name, "err", err)
		}
		return nil, "", nil
	}
	var dm *store.DamagedError
	if errors.As(err, &dm) {
		// A blob the storage holds damaged (create-only: storing it again
		// would keep it): once read again with the same wrong bytes it is
		// removed, and the stage made again here stores it again.
		r.log.Info("a blob of the shared record hashes wrong: reading it again", "stage", st.Name, "blob", dm.Blob.Short(), "bytes", dm.Size)
		rerr := r.shared.s.RemoveDamaged(ctx, dm)
		if rerr == nil {
			r.removedShared.Store(d.key, true)
			r.log.Warn("a blob of the shared record is damaged in the shared store (read twice, the same wrong bytes): removed; the stage is made again here, which stores it again",
				"stage", st.Name, "blob", dm.Blob.Short(), "got", dm.Got.Short(), "store", r.shared.s.String())
			return nil, "", nil
		}
		if ctx.Err() != nil {
			return nil, "", ctx.Err()
		}
		// Left (the second read whole: the first was damaged on its way
		// here; or the blob was replaced): fetched once more.
		r.log.Warn("a blob of the shared record hashed wrong once, and is not removed: fetching it again", "stage", st.Name, "blob", dm.Blob.Short(), "why", rerr)
		rec, err2 := r.materialize(ctx, st, d.params, d.ins, srec)
		if err2 == nil {
			return rec, srec.Host, nil
		}
		if !errors.Is(err2, store.ErrDigestMismatch) {
			return nil, "", err2
		}
		return nil, "", fmt.Errorf("%w; not removed (%v), and fetched again: %v; 'ferry store verify --repair %s' hashes every blob and removes the damaged ones, and the next run makes the stage again", err, rerr, err2, r.shared.s)
	}
	if errors.Is(err, store.ErrDigestMismatch) {
		return nil, "", fmt.Errorf("%w; 'ferry store verify --repair %s' removes the damaged blob, and the next run makes the stage again", err, r.shared.s)
	}
	if err != nil {
		return nil, "", err
	}
	return rec, srec.Host, nil
}

// materialize fetches the blobs of srec the local store lacks (verified
// before they are adopted) and commits the local record.
func (r *runner) materialize(ctx context.Context, st *StageSpec, params json.RawMessage, ins []manifest.Input, srec *store.Record) (*manifest.Record, error) {
	rec, err := manifest.FromStoreRecord(r.shared.s.String(), srec)
	if err != nil {
		return nil, err
	}
	if params != nil {
		rec.Params, rec.Inputs = params, ins
	}
	outs := rec.Outputs
	var need []int
	var total int64
	for i, o := range outs {
		if r.store.CheckBlob(o.Digest, o.Size, false) != "" {
			need = append(need, i)
			total += o.Size
		}
	}
	if len(need) > 0 {
		dir := filepath.Join(r.store.Root, "fetch")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		prog := r.progress(st.Name)
		prog.SetTotal(total)
		defer closeProgress(prog)
		var mu sync.Mutex
		add := func(n int64) {
			mu.Lock()
			prog.Add(n)
			mu.Unlock()
		}
		// The outputs side by side, each in a slot of the run's (a blob
		// is hashed in order on one core as it comes: one at a time, the
		// shards of a merged model came at about 500 MB/s each).
		slots := r.shared.fetches
		if slots == nil {
			slots = make(chan struct{}, 1)
		}
		g, gctx := errgroup.WithContext(ctx)
	fetch:
		for _, i := range need {
			select {
			case slots <- struct{}{}:
			case <-gctx.Done():
				break fetch
			}
			g.Go(func() error {
				defer func() { <-slots }()
				return r.fetchOutput(gctx, outs[i], dir, add)
			})
		}
		if err := g.Wait(); err != nil {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	rec.Pipeline, rec.Stage = r.spec.Name, st.Name
	if rec.Kind == "" {
		rec.Kind = st.Kind
	}
	if err := r.store.Commit(rec); err != nil {
		return nil, err
	}
	return rec, nil
}

// fetchOutput fetches the blob of o into the local store through a file
// in dir named by its digest (a killed fetch resumes from its partial).
// Two stages of this run that want the same blob (a tokenizer file, say)
// take turns: the second finds it stored.
func (r *runner) fetchOutput(ctx context.Context, o manifest.Output, dir string, add func(int64)) error {
	defer r.lockKey("blob " + o.Digest.Hex())()
	if r.store.CheckBlob(o.Digest, o.Size, false) == "" {
		add(o.Size)
		return nil
	}
	tmp := filepath.Join(dir, o.Digest.Hex())
	if err := r.shared.s.FetchBlob(ctx, o.Digest, tmp, add); err != nil {
		return fmt.Errorf("fetching %s (%s) from %s: %w", o.Path, FormatBytes(o.Size), r.shared.s, err)
	}
	_, _, err := r.store.AdoptKnown(tmp, o.Digest, o.Size)
	os.Remove(tmp)
	return err
}

// progress is the progress reporter of a stage (a no-op without one).
func (r *runner) progress(stage string) Progress {
	if r.opts.Progress == nil {
		return nopProgress{}
	}
	return r.opts.Progress(stage)
}

// shareProgress is the progress reporter of stage's upload to the
// shared store.
func (r *runner) shareProgress(stage string) Progress {
	if r.opts.ShareProgress != nil {
		return r.opts.ShareProgress(stage)
	}
	return r.progress(stage)
}

// shareBar is the progress of one stage's upload to the shared store,
// drawn by its early uploads and then by its share: opened when first
// needed, closed once.
type shareBar struct {
	r      *runner
	stage  string
	mu     sync.Mutex
	p      Progress
	total  int64
	closed bool
}

func (b *shareBar) open() Progress {
	if b.p == nil {
		b.p = b.r.shareProgress(b.stage)
	}
	return b.p
}

// grow adds n bytes to the total (an output stored early, the total of
// the stage's outputs not known yet).
func (b *shareBar) grow(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.total += n
		b.open().SetTotal(b.total)
	}
}

// setTotal sets the total: the stage's outputs, once it is done.
func (b *shareBar) setTotal(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.total = n
		b.open().SetTotal(n)
	}
}

func (b *shareBar) add(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed && n > 0 {
		b.open().Add(n)
	}
}

// adder counts n bytes stored, but not the first skip of them: those an
// early upload of the same blob counted before it failed, which the
// upload that follows it counts again (it resumes from the parts stored,
// telling them first, or starts over).
func (b *shareBar) adder(skip int64) func(int64) {
	return func(n int64) {
		if skip > 0 {
			k := min(skip, n)
			skip -= k
			n -= k
		}
		b.add(n)
	}
}

func (b *shareBar) close() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed && b.p != nil {
		closeProgress(b.p)
	}
	b.closed = true
}

func closeProgress(p Progress) {
	if c, ok := p.(interface{ Close() error }); ok {
		c.Close()
	}
}

// leaseStage takes st's lease, waiting while another machine holds it
// (each new holder or end time is an event). It returns the lease, or,
// when the stage's record appeared while it waited and the run need not
// force it, the record fetched into the local store and its maker.
func (r *runner) leaseStage(ctx context.Context, st *StageSpec, d decision, forced bool) (*store.Lease, *manifest.Record, string, time.Duration, error) {
	name := leaseName(d.key)
	var last waitSeen
	var waited time.Duration
	start := time.Now()
	onWait := func(h *store.HeldError) {
		if !last.news(h.Holder, h.Until) {
			return
		}
		if last.holder == "" {
			r.lifecycle("stage waiting", "stage", st.Name, "step", r.stepOf(st.Name), "holder", h.Holder, "until", h.Until.Format(time.RFC3339))
		}
		last = waitSeen{h.Holder, h.Until}
		why := fmt.Sprintf("being made on %s, lease until %s", h.Holder, h.Until.Local().Format("15:04:05"))
		r.emit(Event{Event: EventWaiting, Stage: st.Name, Kind: st.Kind, Reason: why, Holder: h.Holder, Until: &h.Until})
	}
	l, err := r.shared.s.WaitLease(ctx, name, r.shared.ttl, r.shared.poll, onWait)
	if last.holder != "" {
		waited = time.Since(start)
	}
	if err != nil {
		return nil, nil, "", waited, err
	}
	r.noteTakeover(st, l)
	release := func() {
		if rerr := l.Release(context.WithoutCancel(ctx)); rerr != nil {
			r.log.Warn("could not release a stage lease (it expires after its ttl)", "stage", st.Name, "err", rerr)
		}
	}
	if !forced {
		// The record may have been committed while we waited, or just
		// before the lease was taken (its maker released it after the
		// commit).
		rec, host, err := r.fromShared(ctx, st, d)
		if err != nil || rec != nil {
			release()
			return nil, rec, host, waited, err
		}
	}
	if r.markLease(ctx, st, l, makingNote{Kind: st.Kind, KindVersion: r.spec.KindOf(st).Version, Params: d.params}) {
		// Marked under its own lease: the run's pending mark goes.
		r.pending.done(ctx, r, st.Name)
	}
	return l, nil, "", waited, nil
}

// pendingMarks marks the stages a run may make before it can work out
// their keys (their inputs are imported or made by this run first): under
// a lease of the run's own, in each stage's ref group, as its stage lease
// is marked once taken. A machine that cannot key such a stage (its
// input files are not there) then waits for this run, from its start,
// instead of taking the record the ref names before this run points it
// at a new one: the window while this machine still imports new files is
// closed. A stage's mark goes once the stage is decided here (its own
// lease marked, or skipped, fetched, failed); the lease goes when none is
// left, or when the run ends.
type pendingMarks struct {
	mu   sync.Mutex
	l    *store.Lease
	left map[string]bool // stage → marked
	gone bool
}

// markPending marks the stages of rep (the run's plan) that this run may
// make: selected, shareable, and to run or pending. A mark that cannot be
// written is a warning: it only spares a machine without the files the
// record made before this run.
func (r *runner) markPending(ctx context.Context, rep *Report) {
	var stages []*StageSpec
	for _, sr := range rep.Stages {
		if sr.Action != ActionRun && sr.Action != ActionPending {
			continue
		}
		if st := r.spec.Lookup(sr.Stage); st != nil && shareable(st) {
			stages = append(stages, st)
		}
	}
	if len(stages) == 0 {
		return
	}
	// One name per cache (its lock makes the run its only holder): the
	// next run on it takes over at once the lease of one killed, whose
	// marks then no longer count; another holder (a cache of the same
	// path and host name elsewhere) gets a name of its own.
	name := runLeaseName(r.opts.Host, r.spec.Store, nil)
	l, err := r.shared.s.AcquireLease(ctx, name, r.shared.ttl)
	var held *store.HeldError
	if errors.As(err, &held) {
		var id [8]byte
		rand.Read(id[:])
		l, err = r.shared.s.AcquireLease(ctx, runLeaseName(r.opts.Host, r.spec.Store, id[:]), r.shared.ttl)
	}
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("could not mark the stages this run makes (a machine without their input files may take the records made before this run until they are shared)", "err", err)
		}
		return
	}
	p := &pendingMarks{l: l, left: map[string]bool{}}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for _, st := range stages {
		g.Go(func() error {
			_, params, _, err := r.key(st, nil)
			var note []byte
			if err == nil {
				note, err = json.Marshal(makingNote{Kind: st.Kind, KindVersion: r.spec.KindOf(st).Version, Params: params})
			}
			if err == nil {
				err = l.Mark(gctx, manifest.StageRef(r.spec.Name, st.Name), note)
			}
			if err != nil {
				if ctx.Err() == nil {
					r.log.Warn("could not mark a stage this run may make (a machine without its input files may take the record made before this run until it is shared)", "stage", st.Name, "err", err)
				}
				return nil
			}
			p.mu.Lock()
			p.left[st.Name] = true
			p.mu.Unlock()
			return nil
		})
	}
	g.Wait()
	r.pending = p
	if len(p.left) == 0 {
		p.release(ctx)
	}
}

// runLeaseName is the name of the lease of a run on host whose cache is
// store, or of one with id (another holder has that one).
func runLeaseName(host, store string, id []byte) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00", host, store)
	h.Write(id)
	return "run/" + hex.EncodeToString(h.Sum(nil)[:12])
}

// done removes stage's mark; the lease goes with the last one.
func (p *pendingMarks) done(ctx context.Context, r *runner, stage string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	if !p.left[stage] || p.gone {
		p.mu.Unlock()
		return
	}
	delete(p.left, stage)
	last := len(p.left) == 0
	p.mu.Unlock()
	if last {
		p.release(ctx)
		return
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(r.shared.ttl, 15*time.Second))
	defer cancel()
	if err := p.l.Unmark(uctx, manifest.StageRef(r.spec.Name, stage)); err != nil {
		// Left until the run's lease goes: a machine waits a while longer.
		r.log.Debug("could not remove a stage's pending mark", "stage", stage, "err", err)
	}
}

// release gives the lease back, with the marks left (once).
func (p *pendingMarks) release(ctx context.Context) {
	if p == nil {
		return
	}
	p.mu.Lock()
	if p.gone {
		p.mu.Unlock()
		return
	}
	p.gone = true
	p.mu.Unlock()
	p.l.Release(context.WithoutCancel(ctx))
}

// makingNote is what the mark of a stage's lease says the holder makes
// (Lease.Mark, in the group of the stage's ref): a machine that cannot
// work out the stage's key (its inputs' files are not there) waits for a
// lease whose note is what its file makes, then takes the stage's ref.
type makingNote struct {
	Kind        string          `json:"kind"`
	KindVersion string          `json:"kind_version"`
	Params      json.RawMessage `json:"params"`
}

// markLease marks l, st's lease, with what it makes, in the group of st's
// ref. A mark only spares a machine that cannot key st the record the ref
// names before: one not written is a warning, not the stage's failure.
func (r *runner) markLease(ctx context.Context, st *StageSpec, l *store.Lease, n makingNote) bool {
	note, err := json.Marshal(n)
	if err == nil {
		err = l.Mark(ctx, manifest.StageRef(r.spec.Name, st.Name), note)
	}
	if err != nil && ctx.Err() == nil {
		r.log.Warn("could not mark the stage's lease (a machine without this stage's input files may take the record made before this one until it is shared)", "stage", st.Name, "err", err)
	}
	return err == nil
}

// beingMade is what st, whose inputs cannot be keyed here, stands for
// while another machine makes it with this file's kind, format version
// and parameters (a live lease marked in the group of st's ref): a stage
// being made, which a run waits for before it takes the ref (that
// machine points it at what it made). None (making "") when no machine
// is.
func (r *runner) beingMade(ctx context.Context, st *StageSpec, params json.RawMessage) (outsideInput, error) {
	ms, err := r.shared.s.Marked(ctx, manifest.StageRef(r.spec.Name, st.Name))
	if err != nil {
		return outsideInput{}, err
	}
	for _, m := range ms {
		var n makingNote
		if json.Unmarshal(m.Note, &n) != nil {
			continue
		}
		if r.differs(st, &manifest.Record{Kind: n.Kind, KindVersion: n.KindVersion, Params: n.Params}, params, nil, "") != "" {
			continue
		}
		return outsideInput{why: fmt.Sprintf("stage %s is being made on %s (lease until %s)", st.Name, m.Holder, m.Until.Local().Format("15:04:05")), making: m.Holder, until: m.Until}, nil
	}
	return outsideInput{}, nil
}

// noteTakeover logs a stage lease taken over from a machine that had
// stopped renewing it (died, or was killed and ran here before).
func (r *runner) noteTakeover(st *StageSpec, l *store.Lease) {
	switch l.Took {
	case store.TookExpired:
		r.log.Info("stage lease taken over", "stage", st.Name, "from", l.TakenFrom, "why", "its lease expired (the machine stopped renewing it)")
	case store.TookResumed:
		r.log.Info("stage lease taken over", "stage", st.Name, "from", l.TakenFrom, "why", "a run on this cache held it and did not give it back (killed, or the store did not answer)")
	}
}

// underLease is ctx, also cancelled (with the lease's error as its cause)
// when l is lost.
func underLease(ctx context.Context, l *store.Lease) (context.Context, func()) {
	cctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(l.Context(), func() {
		if err := l.Err(); err != nil {
			cancel(err)
		}
	})
	return cctx, func() { stop(); cancel(nil) }
}

// beforeShare, set by tests only, is called before a stage is shared.
var beforeShare func(stage string)

// earlyShare stores a running stage's outputs in the shared store as the
// stage finishes them (Env's AdoptFile, AdoptKnown and Ingest), under
// the stage's lease, before its record: a merge's first shards go up while
// it writes the others, on the cores its disk-bound writes leave idle,
// instead of after it, beside the stages that follow it. share then
// stores only what is not there yet, and the record still comes last:
// nothing is shared that is not whole, and a blob stored for a stage that
// fails is the gc's once the lease that protects it is gone. A nil
// earlyShare stores nothing.
type earlyShare struct {
	r       *runner
	l       *store.Lease
	ctx     context.Context
	cancel  func()
	wg      sync.WaitGroup
	mu      sync.Mutex
	ups     map[manifest.Digest]*earlyUpload
	stopped bool
	// bar shows the uploads from the first one; share takes it over
	// (taken), and stop closes it otherwise.
	bar   *shareBar
	taken bool
}

// earlyMin is the smallest blob stored early: a smaller one goes up with
// the rest of its stage's outputs, at little cost, instead of a write of
// the lease each (the lease names every blob it protects).
var earlyMin int64 = store.DefaultPartSize

type earlyUpload struct {
	done    chan struct{}
	err     error
	counted atomic.Int64 // bytes told to the bar
	stream  bool         // of bytes still being written (addStream)
}

// earlyFor is the early sharing of stage, run under lease l.
func (r *runner) earlyFor(ctx context.Context, stage string, l *store.Lease) *earlyShare {
	ctx, cancel := underLease(ctx, l)
	return &earlyShare{r: r, l: l, ctx: ctx, cancel: cancel, ups: map[manifest.Digest]*earlyUpload{}, bar: &shareBar{r: r, stage: stage}}
}

// add starts storing the finished output blob d of size bytes (once per
// blob), in a slot of the run's uploads.
func (e *earlyShare) add(d manifest.Digest, size int64) { e.start(d, size, nil) }

// addStream starts storing the blob d of size bytes that src reads while
// the stage writes it (Env.ShareAhead), once per blob as add: the blob's
// own add later finds it started. It reports whether it took src (closed
// when the upload ends).
func (e *earlyShare) addStream(d manifest.Digest, size int64, src io.ReaderAt) bool {
	return e.start(d, size, src)
}

// start is add (src nil: the local blob) and addStream.
func (e *earlyShare) start(d manifest.Digest, size int64, src io.ReaderAt) bool {
	if size < earlyMin {
		return false
	}
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		return false
	}
	u := &earlyUpload{done: make(chan struct{}), stream: src != nil}
	if old, ok := e.ups[d]; ok {
		// Started already; or a stream that failed (its writer started
		// over), which the whole blob, handed over now, replaces: the
		// bytes it showed are not shown again. (A stream still going
		// when the blob is handed over is left to the share to redo, if
		// it fails.)
		failed := false
		select {
		case <-old.done:
			failed = old.err != nil && old.stream
		default:
		}
		if !failed || src != nil {
			e.mu.Unlock()
			return false
		}
		u.counted.Store(old.counted.Load())
	} else {
		e.bar.grow(size)
	}
	e.ups[d] = u
	e.mu.Unlock()
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer func() { // after done is closed
			if u.err != nil && earlyFailed != nil {
				earlyFailed(d)
			}
		}()
		defer close(u.done)
		if c, ok := src.(io.Closer); ok {
			defer c.Close()
		}
		sh := e.r.shared
		if src == nil {
			// A stream follows its writer: the stage bounds how many go
			// at once (a merge's shards being written), and one waiting
			// for bytes holds none of the run's blob slots.
			select {
			case sh.slots <- struct{}{}:
			case <-e.ctx.Done():
				u.err = context.Cause(e.ctx)
				return
			}
			defer func() { <-sh.slots }()
		}
		// The bar shows each byte of the blob once: what this upload
		// tells past what is shown already (by one it replaces).
		var told int64
		count := func(n int64) {
			told += n
			if shown := u.counted.Load(); told > shown {
				u.counted.Store(told)
				e.bar.add(told - shown)
			}
		}
		// Protected from gc before it is stored, as share does.
		if u.err = e.l.Protect(e.ctx, d); u.err == nil {
			if src == nil {
				u.err = e.r.putOutput(e.ctx, d, size, count)
			} else {
				u.err = e.r.shared.s.PutBlob(e.ctx, d, src, size, count)
				if errors.Is(u.err, store.ErrDigestMismatch) && e.ctx.Err() == nil {
					// The stage's pass ahead and its writer disagree:
					// a bug to report; the blob it made goes up as
					// usual once whole.
					e.r.log.Warn("an output's bytes differ from the digest computed ahead of them: stored once whole instead", "blob", d.Short(), "err", u.err)
				}
			}
		}
		if earlyStored != nil && u.err == nil {
			earlyStored(d)
		}
		if u.err != nil && e.ctx.Err() == nil {
			// share stores it again, and says why if that fails too.
			e.r.log.Debug("output not stored early", "blob", d.Short(), "err", u.err)
		}
	}()
	return true
}

// stored waits for the early upload of d, if one was started under l, and
// says whether it stored the blob. One stored under another lease (lost
// since, and taken over before this machine regained it) is not taken
// for stored: unprotected meanwhile, a gc may have removed it.
func (e *earlyShare) stored(ctx context.Context, l *store.Lease, d manifest.Digest) bool {
	ok, _ := e.wait(ctx, l, d)
	return ok
}

// wait is stored, and the bytes of d the early upload told its bar.
func (e *earlyShare) wait(ctx context.Context, l *store.Lease, d manifest.Digest) (bool, int64) {
	if e == nil || e.l != l {
		return false, 0
	}
	e.mu.Lock()
	u := e.ups[d]
	e.mu.Unlock()
	if u == nil {
		return false, 0
	}
	select {
	case <-u.done:
		return u.err == nil, u.counted.Load()
	case <-ctx.Done():
		return false, u.counted.Load()
	}
}

// takeBar hands the bar of the uploads to share under l, which goes on
// with it (nil: none under l; share opens its own).
func (e *earlyShare) takeBar(l *store.Lease) *shareBar {
	if e == nil || e.l != l {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.taken {
		return nil
	}
	e.taken = true
	return e.bar
}

// stop cancels the uploads still running and waits for them: before the
// lease they are under is released.
func (e *earlyShare) stop() {
	if e == nil {
		return
	}
	e.mu.Lock()
	e.stopped = true
	taken := e.taken
	e.mu.Unlock()
	e.cancel()
	e.wg.Wait()
	if !taken {
		e.bar.close()
	}
}

// earlyStored, set by tests only, is told of each blob stored early;
// sharePut of each blob share stores (or finds stored) itself.
var (
	earlyStored func(d manifest.Digest)
	sharePut    func(d manifest.Digest)
	// earlyFailed, set by tests only, is told of each early upload that
	// failed, once it is over.
	earlyFailed func(d manifest.Digest)
)

// publish stores rec's outputs and record in the shared store, behind the
// run, then releases l (nil: a record made here earlier, shared late);
// early holds the outputs stored while the stage ran (nil: none). Its
// error is the run's (Wait), not the stage's: the stage is made and
// recorded here, and the next run shares it.
func (r *runner) publish(ctx context.Context, st *StageSpec, rec *manifest.Record, l *store.Lease, early *earlyShare) {
	sh := r.shared
	sh.wg.Add(1)
	go func() {
		defer sh.wg.Done()
		// Its pending mark (a stage up to date here), once it is shared
		// or found there: share removes it as soon as the ref is pointed
		// or the stage's lease marked.
		defer r.pending.done(ctx, r, st.Name)
		if beforeShare != nil {
			beforeShare(st.Name)
		}
		err := r.share(ctx, st, rec, l, early)
		for tries := 0; err != nil && l != nil && errors.Is(l.Err(), store.ErrLeaseLost) && ctx.Err() == nil && tries < 3; tries++ {
			// Lost while sharing (this machine paused past the ttl): the
			// machine that took it over may share it; waited for, then
			// shared again under the lease regained (what is stored
			// stays, a record already there stands).
			r.log.Warn("stage lease lost while sharing: waiting for the machine that took it over", "stage", st.Name, "err", l.Err())
			nl, werr := sh.s.WaitLease(ctx, leaseName(rec.Key), sh.ttl, sh.poll, nil)
			if werr != nil {
				err = werr
				break
			}
			l = nl
			r.markLease(ctx, st, l, makingNote{Kind: rec.Kind, KindVersion: rec.KindVersion, Params: rec.Params})
			// What was stored early is looked for again (share's
			// putOutput finds it there or stores it): the lease that
			// protected it was lost meanwhile.
			early.stop()
			err = r.share(ctx, st, rec, l, early)
		}
		early.stop()
		if l != nil {
			if rerr := l.Release(context.WithoutCancel(ctx)); rerr != nil && err == nil {
				err = rerr
			}
		}
		if err != nil {
			sh.mu.Lock()
			sh.errs = append(sh.errs, fmt.Errorf("stage %s: made here, not shared to %s: %w (the next run shares it)", st.Name, sh.s, err))
			if sh.failed == nil {
				sh.failed, sh.cut = map[string]string{}, map[string]bool{}
			}
			sh.failed[st.Name] = err.Error()
			sh.cut[st.Name] = ctx.Err() != nil
			sh.mu.Unlock()
		}
	}()
}

// putOutput stores the local blob d (size bytes) in the shared store.
func (r *runner) putOutput(ctx context.Context, d manifest.Digest, size int64, add func(int64)) error {
	// A blob whose stamp says it is the file hashed when it was made is
	// not hashed whole again (its parts are, and the stamp is checked
	// again before the upload completes): that pass, one core's SHA-256,
	// held the upload of each large blob. --verify hashes it.
	var unchanged func() error
	if !r.opts.Verify && r.store.CheckBlob(d, size, false) == "" {
		unchanged = func() error {
			if why := r.store.CheckBlob(d, size, false); why != "" {
				return errors.New(why)
			}
			return nil
		}
	}
	return r.shared.s.PutKnownFile(ctx, d, r.store.BlobPath(d), unchanged, add)
}

func (r *runner) share(ctx context.Context, st *StageSpec, rec *manifest.Record, l *store.Lease, early *earlyShare) error {
	sh := r.shared
	if l == nil {
		if whole, err := r.sharedWhole(ctx, rec); err != nil {
			return err
		} else if whole {
			if err := r.setRef(ctx, st, rec.Key); !errors.Is(err, errRecordPruned) {
				return err
			}
			// Pruned meanwhile: shared again below.
		}
	}
	var ds []manifest.Digest
	var total int64
	for _, o := range rec.Outputs {
		total += o.Size
		ds = append(ds, o.Digest)
	}
	start := time.Now()
	if l == nil {
		// A stage made here earlier (a run killed while it uploaded, a
		// store seeded late): shared under the stage's lease, so that a
		// machine that wants it meanwhile waits instead of making it.
		// Another machine holding it is making it: its record, when it
		// comes, is the one, and this run does not wait for it.
		var err error
		l, err = sh.s.AcquireLease(ctx, leaseName(rec.Key), sh.ttl)
		var held *store.HeldError
		if errors.As(err, &held) {
			r.log.Info("stage not shared from here: another machine is making it", "stage", st.Name, "holder", held.Holder, "until", held.Until.Format(time.RFC3339))
			return nil
		}
		if err != nil {
			return err
		}
		defer l.Release(context.WithoutCancel(ctx))
		r.noteTakeover(st, l)
		if r.markLease(ctx, st, l, makingNote{Kind: rec.Kind, KindVersion: rec.KindVersion, Params: rec.Params}) {
			r.pending.done(ctx, r, st.Name)
		}
		if whole, err := r.sharedWhole(ctx, rec); err != nil {
			return err
		} else if whole {
			if err := r.setRef(ctx, st, rec.Key); !errors.Is(err, errRecordPruned) {
				return err
			}
		}
	}
	// The outputs are protected from gc before they are stored or found
	// stored (Lease.Protect).
	if len(ds) > 0 {
		if err := l.Protect(ctx, ds...); err != nil {
			return err
		}
	}
	// Its upload's progress: the bar its early uploads drew, if any.
	bar := early.takeBar(l)
	own := bar == nil
	if own {
		bar = &shareBar{r: r, stage: st.Name}
	}
	bar.setTotal(total)
	defer bar.close()
	// The outputs upload side by side, each in a slot of its own: the
	// last stage's outputs are what the run waits for at its end.
	// An output stored while the stage ran (early) is not stored again;
	// one whose early upload failed is, as soon as that is known, while
	// the others are still waited for.
	g, gctx := errgroup.WithContext(ctx)
	// An early upload's bytes are shown once: for the first output of its
	// blob (two outputs may hold the same bytes).
	var claimMu sync.Mutex
	claimed := map[manifest.Digest]bool{}
	for _, o := range rec.Outputs {
		g.Go(func() error {
			ok, counted := early.wait(gctx, l, o.Digest)
			claimMu.Lock()
			if own || claimed[o.Digest] {
				counted = 0
			}
			claimed[o.Digest] = true
			claimMu.Unlock()
			if ok {
				bar.add(o.Size - counted)
				return nil
			}
			select {
			case sh.slots <- struct{}{}:
			case <-gctx.Done():
				return gctx.Err()
			}
			defer func() { <-sh.slots }()
			if sharePut != nil {
				sharePut(o.Digest)
			}
			if err := r.putOutput(gctx, o.Digest, o.Size, bar.adder(counted)); err != nil {
				return fmt.Errorf("output %s: %w", o.Path, err)
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
	srec, err := manifest.ToStoreRecord(rec)
	if err != nil {
		return err
	}
	if err := l.Err(); err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		_, err = sh.s.CommitRecord(ctx, srec)
		if err != nil && !errors.Is(err, store.ErrRecordExists) {
			// ErrRecordExists: another machine made the same key too (a
			// forced run, a lease lost and taken over); the same bytes,
			// the first record stands.
			return err
		}
		// The record that stood may be an old one a gc pruned before it
		// read this ref: written again, once.
		if err = r.setRef(ctx, st, rec.Key); !errors.Is(err, errRecordPruned) || attempt > 0 {
			break
		}
	}
	if err != nil {
		return err
	}
	took := time.Since(start).Seconds()
	r.lifecycle("stage shared", "stage", st.Name, "step", r.stepOf(st.Name), "store", r.spec.Shared, "outputs", len(rec.Outputs), "bytes", total, "seconds", fmt.Sprintf("%.3f", took))
	r.emit(Event{Event: EventShared, Stage: st.Name, Kind: st.Kind, Reason: "shared to " + r.spec.Shared, Seconds: took, Bytes: total})
	return nil
}

// sharedWhole says whether the shared store holds rec's record and every
// blob it names with its size: a blob removed since (verify --repair, a
// bucket's lifecycle rule) is stored again from here by share, as the
// stage it breaks is made nowhere else again.
func (r *runner) sharedWhole(ctx context.Context, rec *manifest.Record) (bool, error) {
	if _, err := r.shared.s.Backend().Head(ctx, "records/"+rec.Key+".json"); errors.Is(err, store.ErrNotFound) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	for _, o := range rec.Outputs {
		size, ok, err := r.shared.s.HasBlob(ctx, o.Digest)
		if err != nil {
			return false, err
		}
		if !ok || size != o.Size {
			r.log.Warn("a blob of a stage made here is gone from the shared store: stored again from here", "stage", rec.Stage, "output", o.Path)
			return false, nil
		}
	}
	return true, nil
}

// setRef points refs/pipelines/<pipeline>/<stage> at key. A ref that
// named a record another machine made with other parameters may mean two
// files of this pipeline's name disagree, which is worth a warning: refs
// (status, gc --prune-records) follow whichever ran last.
func (r *runner) setRef(ctx context.Context, st *StageSpec, key string) error {
	name := manifest.StageRef(r.spec.Name, st.Name)
	if ref, err := r.shared.s.GetRef(ctx, name); err == nil && ref.Value != key {
		if old, err := r.shared.s.RefRecord(ctx, ref); err == nil {
			prev, perr := manifest.FromStoreRecord(r.shared.s.String(), old)
			// Another machine's record (this machine's own is an earlier
			// run of an edited file, as is usual).
			if rec := r.store.Record(key); perr == nil && rec != nil && old.Host != r.shared.s.Host() && (prev.Kind != rec.Kind || !jsonEqual(prev.Params, rec.Params)) {
				r.log.Warn("another machine made this stage of this pipeline's name with other parameters: if its file is not an earlier version of this one, the two disagree, and the stage's ref follows whichever runs last ('store gc --prune-records' drops the other's results); give one file another name",
					"stage", st.Name, "made_on", old.Host, "there", clip(string(prev.Params)), "here", clip(string(rec.Params)))
			}
		}
	}
	if err := r.shared.s.PointRef(ctx, name, key); err != nil {
		return err
	}
	// A gc pruning records (no ref names them) may have read the refs
	// before this one pointed at key: once no gc runs, the record is
	// there, or it is shared again.
	if err := r.shared.s.WaitGC(ctx); err != nil {
		return err
	}
	if _, err := r.shared.s.Backend().Head(ctx, "records/"+key+".json"); errors.Is(err, store.ErrNotFound) {
		return errRecordPruned
	} else if err != nil {
		return err
	}
	return nil
}

// errRecordPruned reports a record a gc pruned while a ref was pointed
// at it: shared again from here.
var errRecordPruned = errors.New("the record was pruned by a gc meanwhile")

// intact says whether every output of rec is here, by its stamp.
func (r *runner) intact(rec *manifest.Record) bool {
	for _, o := range rec.Outputs {
		if r.store.CheckBlob(o.Digest, o.Size, false) != "" {
			return false
		}
	}
	return true
}

// fetchInputs returns ins with each input that is in the shared store
// only (an input from outside a --only or --from selection, made on
// another machine: planSharedRef) fetched into the local store, recorded
// there and given its view; each once per run.
func (r *runner) fetchInputs(ctx context.Context, ins []Input) ([]Input, error) {
	out := append([]Input(nil), ins...)
	for i, in := range out {
		if !in.fetched {
			continue
		}
		st := r.spec.Lookup(in.Stage)
		err := func() error {
			defer r.lockKey("input " + in.Stage)()
			if rec := r.store.StageRecord(r.spec.Name, in.Stage); rec != nil && rec.Key == in.Key && r.intact(rec) {
				out[i] = r.recordInput(st, rec) // fetched by another stage of this run
				return nil
			}
			srec, err := r.shared.s.Record(ctx, in.Key)
			if err != nil {
				return fmt.Errorf("input %s: record %s in %s: %w", in.Stage, in.Key, r.shared.s, err)
			}
			rec, err := r.materialize(ctx, st, nil, nil, srec)
			if errors.Is(err, store.ErrDigestMismatch) {
				// Not this run's to make again (outside the selection).
				return fmt.Errorf("input %s: %w; 'ferry store verify --repair %s' removes the damaged blob, and the next run of %s on a machine that can make it (or that has it in its cache) stores it again", in.Stage, err, r.shared.s, in.Stage)
			}
			if err != nil {
				return fmt.Errorf("input %s: %w", in.Stage, err)
			}
			r.log.Info("input fetched from the shared store", "stage", in.Stage, "host", srec.Host, "outputs", len(rec.Outputs))
			out[i] = r.recordInput(st, rec)
			return nil
		}()
		if err != nil {
			return nil, err
		}
		if err := r.store.MakeView(out[i].Dir, out[i].Outputs); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// trimCache keeps this machine's cache of a shared store within its bound
// (--cache-max, cache_max:) after a run: when its blobs take more, the
// records no pipeline stage points at any more (results of earlier
// parameters or inputs) that the shared store holds are dropped, and the
// blobs no record names with them; a later run that wants one fetches it
// again. What the stages' views show stays, whatever it takes (a warning
// says so), and so do imports (the bucket does not have them).
func (r *runner) trimCache(ctx context.Context) error {
	bound := r.opts.CacheMax
	if bound == 0 {
		bound = r.spec.CacheMax
	}
	if bound <= 0 || r.shared == nil {
		return nil
	}
	du, err := r.store.DiskUsage()
	if err != nil {
		return err
	}
	if du.BlobBytes <= bound {
		return nil
	}
	var drop []string
	for _, k := range r.store.Unpointed() {
		_, err := r.shared.s.Backend().Head(ctx, "records/"+k+".json")
		switch {
		case err == nil:
			drop = append(drop, k)
		case !errors.Is(err, store.ErrNotFound):
			return err
		}
	}
	n, err := r.store.DropRecords(drop)
	if err != nil {
		return err
	}
	rep, err := r.store.GC(false)
	if err != nil {
		return err
	}
	left := du.BlobBytes - rep.RemovedBytes
	r.log.Info("cache trimmed", "cache", r.store.Root, "records", n, "blobs", rep.RemovedBlobs, "freed", FormatBytes(rep.RemovedBytes), "left", FormatBytes(left), "bound", FormatBytes(bound))
	if left > bound {
		r.log.Warn("the cache is over its bound: what the stages' views show takes more", "cache", r.store.Root, "held", FormatBytes(left), "bound", FormatBytes(bound))
	}
	return nil
}

// waitShared waits for the outputs being shared behind the run and
// returns what failed.
func (sh *sharedStore) wait() error {
	if sh == nil {
		return nil
	}
	sh.wg.Wait()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return errors.Join(sh.errs...)
}

// madeOn is the reason of a stage fetched from the shared store.
func madeOn(host, shared string, waited time.Duration) string {
	s := "made on " + host
	if host == "" {
		s = "made on another machine"
	}
	if waited > 0 {
		s += fmt.Sprintf(" while this run waited %.1fs", waited.Seconds())
	}
	return s + "; fetched from " + shared
}
