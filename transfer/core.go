package transfer

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/journal"
	"github.com/ferry-llm/ferry/internal/progress"
)

// The fan-out core. Run surveys every destination at once (one listing
// command each: what is there, of what size and mtime), decides per file
// what each destination needs (nothing, a check, the rest of a partial,
// all of it), then reads each source file once, in plan order, and hands
// each piece to every destination that lacks it:
//
//   - a file of one chunk ("small") is written whole into its partial by
//     one of many writers, many files in flight on every session; its
//     check is batched: one remote command hashes many partials (after one
//     sync -f made them durable), and those that match are renamed into
//     place (where a destination reads a file back as it writes it, a
//     smallChecker, one read back right is renamed at once);
//   - a larger file's partial is made once, its chunks are written by one
//     writer per session, journaled once durable, hashed on the remote
//     host as they land, and the file is renamed into place once every
//     chunk is checked against the digests of what was read.
//
// The bytes read and not yet written everywhere are bounded by
// Options.InFlight. One destination failing never stops the others.

// host is one destination during a run.
type host struct {
	d      Destination
	o      *Options
	p      *Plan
	ep     endpoint
	ctx    context.Context // the run's, cancelled when this destination fails
	cancel context.CancelFunc
	parent context.Context

	idx *destIndex

	jmu   sync.Mutex
	jl    *journal.Log
	state map[string]*fileState

	mu     sync.Mutex
	failed *HostError
	// lost are the files not copied because their source changed during
	// the copy (or its recorded digest lies): the destination's other
	// files go on, and it is reported failed at the end.
	lost []*HostError

	tools   *remoteTools
	listing map[string]entry
	missing bool // the destination directory is not there
	rep     HostReport
	fr      []*FileReport // by plan index
	ups     []*upload     // by plan index; nil: nothing to send
	extra   []string      // what the destination holds under the plan's directories and the plan does not
	prog    progress.Reporter
	sent    atomic.Int64
	bytes   atomic.Int64 // of the files verified there
	start   time.Time

	smallSlots int          // sessions the small files use
	unsettled  atomic.Int64 // small files handed to the writers and not yet to the checks
	large      bool         // a larger file is sent: every connection is in use
	smallQ     chan smallJob
	chunkQ     chan chunkJob
	settleQ    chan *upload
	workers    sync.WaitGroup
	fin        sync.WaitGroup
	vsem       chan struct{} // chunk checks during the send
}

// upload is one file on its way to one destination.
type upload struct {
	h     *host
	i     int // plan index
	f     *File
	fr    *FileReport
	small bool
	old   bool // a file of other content is in place, replaced once this one is verified

	// Larger files:
	need     []bool        // chunks this run writes
	left     atomic.Int32  // of those, not written yet
	written  chan struct{} // closed when left reaches 0
	ready    chan struct{}
	readyErr error
	vwg      sync.WaitGroup // chunk checks under way
	vmu      sync.Mutex
	verified map[int]bool // chunks the remote host hashed right after they were written
	rf       *readFile
}

func newHost(ctx context.Context, d Destination, p *Plan, o *Options) *host {
	h := &host{d: d, o: o, p: p, ep: newEndpoint(d, o, p), parent: ctx, state: map[string]*fileState{},
		fr: make([]*FileReport, len(p.Files)), ups: make([]*upload, len(p.Files))}
	h.ctx, h.cancel = context.WithCancel(ctx)
	h.rep = HostReport{Destination: d.Name, Host: d.Host, Dir: d.Dir}
	for i := range p.Files {
		f := &p.Files[i]
		h.fr[i] = &FileReport{Path: f.Rel, Size: f.Size, Digest: f.Digest}
	}
	return h
}

func (h *host) err() *HostError {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failed
}

// result is the destination's failure at the end of the run: what stopped
// it, else the first file it lost (nil: every file is there).
func (h *host) result() *HostError {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failed == nil && len(h.lost) > 0 {
		return h.lost[0]
	}
	return h.failed
}

// failFile records that file is not copied to this destination. Where its
// source changed during the copy (or lied about its digest), the
// destination's other files go on; any other error stops it (fail).
func (h *host) failFile(file string, err error) {
	if !errors.Is(err, ErrSourceChanged) && !errors.Is(err, ErrSourceDigest) || h.parent.Err() != nil {
		h.fail(file, err)
		return
	}
	h.mu.Lock()
	h.lost = append(h.lost, &HostError{Dest: h.d.Name, File: file, Err: err})
	h.mu.Unlock()
	for i := range h.p.Files { // (not a copy: a Digest may be being learnt)
		if h.p.Files[i].Rel == file {
			h.fr[i].Error = err.Error()
		}
	}
	h.o.Log.Warn("transfer: file not copied", "dest", h.d.Name, "file", file, "err", err)
}

// fail records the destination's first failure and stops its work. A
// failure that is the run's cancellation is reported as ErrInterrupted.
func (h *host) fail(file string, err error) {
	if h.parent.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrSourceChanged)) {
		err = ErrInterrupted
		file = ""
	}
	h.mu.Lock()
	if h.failed != nil {
		h.mu.Unlock()
		return
	}
	h.failed = &HostError{Dest: h.d.Name, File: file, Err: err}
	h.mu.Unlock()
	for i := range h.p.Files { // (not a copy: a Digest may be being learnt)
		if h.p.Files[i].Rel == file {
			h.fr[i].Error = err.Error()
		}
	}
	h.o.Log.Debug("transfer: destination failed", "dest", h.d.Name, "file", file, "err", err)
	h.cancel()
}

// preflights runs the PreFlight check once per host, however many
// destinations are on it.
type preflights struct {
	f  func(ctx context.Context, d Destination) error
	mu sync.Mutex
	m  map[string]*preflight
}

type preflight struct {
	done chan struct{}
	err  error
}

func (p *preflights) check(ctx context.Context, d Destination) error {
	if p.f == nil {
		return nil
	}
	p.mu.Lock()
	c := p.m[d.Host]
	if c == nil {
		c = &preflight{done: make(chan struct{})}
		p.m[d.Host] = c
		p.mu.Unlock()
		c.err = p.f(ctx, d)
		close(c.done)
		return c.err
	}
	p.mu.Unlock()
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run sends the plan to every destination. Each destination is verified
// on its own and one failing does not stop the others: the report says
// what each holds, and the error (a *FailedError) which failed.
func Run(ctx context.Context, p *Plan, dests []Destination, o Options) (*Report, error) {
	o.defaults(p.ChunkSize)
	if o.StateDir == "" {
		return nil, errors.New("transfer: no state directory for the journals")
	}
	if err := os.MkdirAll(o.StateDir, 0o755); err != nil {
		return nil, err
	}
	rep := &Report{Files: len(p.Files), Bytes: p.Bytes()}
	hosts := make([]*host, len(dests))
	pre := &preflights{f: o.PreFlight, m: map[string]*preflight{}}
	stop := make(chan struct{})
	for i, d := range dests {
		h := newHost(ctx, d, p, &o)
		h.start = time.Now()
		if o.Progress != nil {
			h.prog = o.Progress(d.Name, p.Bytes())
		}
		go h.ep.watch(h.ctx, stop)
		hosts[i] = h
	}
	each(hosts, func(h *host) {
		if err := h.survey(pre); err != nil {
			h.fail("", err)
		}
	})
	hashFirst(ctx, p, live(hosts))
	each(live(hosts), func(h *host) {
		if err := h.decide(); err != nil {
			h.fail("", err)
		}
	})
	send(ctx, p, hosts)
	each(live(hosts), func(h *host) {
		if err := h.end(); err != nil {
			h.fail("", err)
		}
	})
	close(stop)

	var failed []*HostError
	var names []string
	for _, h := range hosts {
		// Before the record of what it verified is saved.
		if err := h.ep.flush(context.WithoutCancel(ctx)); err != nil && h.err() == nil {
			h.fail("", err)
		}
		if r, ok := h.ep.(restamper); ok {
			for rel, mt := range r.restamp(context.WithoutCancel(ctx)) {
				if x, ok := h.idx.get(rel); ok {
					x.Mtime = mt
					h.idx.put(rel, x)
				}
			}
		}
		h.ep.closeAll()
		if h.prog != nil {
			h.prog.Close()
		}
		if ctx.Err() != nil && h.err() == nil {
			h.fail("", ErrInterrupted)
		}
		r := h.report()
		if e := h.result(); e != nil {
			failed = append(failed, e)
			names = append(names, h.d.Name)
		} else {
			r.OK = true
		}
		if err := h.idx.save(h.d.Name); err != nil {
			o.Log.Warn("transfer: "+err.Error(), "dest", h.d.Name)
		}
		if h.jl != nil {
			if r.OK {
				h.jl.Remove()
			} else {
				h.jl.Close()
			}
		}
		h.cancel()
		rep.Hosts = append(rep.Hosts, r)
	}
	if len(failed) > 0 {
		return rep, &FailedError{Hosts: failed, Of: len(hosts), Failed: names}
	}
	return rep, nil
}

// roots are the plan's top-level names: every path it sends is under one.
func (p *Plan) roots() []string {
	seen := map[string]bool{}
	var out []string
	add := func(rel string) {
		r, _, _ := strings.Cut(rel, "/")
		if !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	for _, f := range p.Files {
		add(f.Rel)
		if !strings.Contains(f.Rel, "/") {
			add(f.Rel + ".partial") // beside it, not under it
		}
	}
	for _, l := range p.Links {
		add(l.Rel)
	}
	for _, d := range p.Dirs {
		add(d)
	}
	sort.Strings(out)
	return out
}

// conns is how many connections the work so far uses: the small files'
// sessions', or all of them when a larger file is sent.
func (h *host) conns() int {
	if h.large {
		return h.o.Streams
	}
	return max(1, (h.smallSlots+h.o.Sessions-1)/h.o.Sessions)
}

// small reports files sent whole, in one write, with a batched check.
func (p *Plan) small(f *File) bool { return f.Size <= p.ChunkSize }

// survey learns what the destination holds.
func (h *host) survey(pre *preflights) error {
	ctx := h.ctx
	if !h.d.Local && !h.d.S3 { // a local directory, a bucket: no route or interface to check
		if err := pre.check(ctx, h.d); err != nil {
			return err
		}
	}
	var err error
	if h.idx, err = loadIndex(cmp.Or(h.o.IndexDir, h.o.StateDir), h.d.Name); err != nil {
		return err
	}
	if err := h.openJournal(); err != nil {
		return err
	}
	// Where an earlier run did not verify every file of the plan there,
	// something will be sent or checked: the listing's command probes the
	// tools too.
	h.listing, h.missing, err = h.ep.list(ctx, h.p.roots(), h.p.Dirs, !h.idx.covers(h.p))
	return err
}

// digestsFirst is an endpoint that needs each file's digest before it
// sends the file (an S3 upload carries it from its start).
type digestsFirst interface{ digestsFirst() }

// hashFirst hashes, for a plan whose files are hashed as they are sent
// (HashLater), those whose digest some destination needs before the file
// is read for sending: one it holds a file of that size for (trusted or
// checked by digest), or one whose endpoint needs digests first. A file
// that cannot be hashed fails the destinations that need it.
func hashFirst(ctx context.Context, p *Plan, hosts []*host) {
	if p.later == nil {
		return
	}
	var idx []int
	for i := range p.Files {
		f := &p.Files[i]
		if f.Digest != "" {
			continue
		}
		for _, h := range hosts {
			_, first := h.ep.(digestsFirst)
			if e, ok := h.listing[f.Rel]; first || ok && e.kind == 'f' && e.size == f.Size {
				idx = append(idx, i)
				break
			}
		}
	}
	l := p.later
	err := p.hash(ctx, idx, l.jobs, l.hashed, l.cache, func(i int, err error) {
		for _, h := range hosts {
			h.fail(p.Files[i].Rel, err)
		}
	})
	if err != nil {
		for _, h := range hosts {
			h.fail("", err)
		}
	}
}

// decide decides what each file needs at the destination surveyed.
func (h *host) decide() error {
	ctx := h.ctx
	listing := h.listing
	var err error
	var checks []int
	for i := range h.p.Files {
		f := &h.p.Files[i]
		e, ok := listing[f.Rel]
		switch {
		case ok && e.kind == 'd':
			return fmt.Errorf("remote path %s is a directory: %w", h.ep.remote(f.Rel), errNotDir)
		case ok && e.kind == 'f' && e.size == f.Size && f.Digest != "": // (an object's digest may be known only once read)
			if !h.o.Verify && h.trusted(f, e) {
				h.skip(i, e.mtime, true)
				continue
			}
			checks = append(checks, i)
			continue
		}
		h.ups[i] = h.newUpload(i, ok && e.kind == 'f')
	}
	if len(checks) > 0 || h.anyUploads() {
		if h.tools, err = h.ep.probeTools(ctx); err != nil {
			return err
		}
		h.rep.HashCommand = h.tools.hashCmd
		if h.tools.ranges {
			h.rep.HashCommand = "dd | " + h.tools.hashCmd
		}
		if h.tools.label != "" {
			h.rep.HashCommand = h.tools.label
		}
		if h.tools.hashCmd == "" {
			h.rep.HashCommand = ReadBack
			h.o.Log.Info("transfer: no sha256 tool on the remote host; verifying by reading files back", "dest", h.d.Name)
		}
		h.idx.verifiedBy(h.rep.HashCommand)
	} else {
		// Every file was verified by an earlier run, the way it recorded.
		h.rep.HashCommand = h.idx.hashCmd
	}
	if err := h.checkInPlace(checks); err != nil {
		return err
	}
	h.extra = h.extras()
	if !h.anyUploads() && len(h.p.Links) == 0 {
		return nil
	}
	if err := h.ep.mkdirs(ctx, h.p.Dirs, listing, h.missing); err != nil {
		return err
	}
	return h.roomCheck()
}

// trusted reports whether an earlier run verified f at the destination and
// the listing's e shows it untouched since (size and mtime as left).
func (h *host) trusted(f *File, e entry) bool {
	if x, ok := h.idx.get(f.Rel); ok && x.Digest == f.Digest && x.Size == e.size && x.Mtime == e.mtime {
		return true
	}
	st := h.stateOf(f.Rel)
	return st.done != nil && st.done.digest == f.Digest && st.done.size == e.size && st.done.mtime == e.mtime && e.mtime != 0
}

// skip records file i as verified at the destination without sending it.
func (h *host) skip(i int, mtime int64, trusted bool) {
	f := &h.p.Files[i]
	fr := h.fr[i]
	fr.Verified, fr.Skipped, fr.Trusted = true, true, trusted
	fr.Digest = f.Digest
	h.bytes.Add(f.Size)
	h.idx.put(f.Rel, indexEntry{Size: f.Size, Mtime: mtime, Digest: f.Digest})
	if h.prog != nil {
		h.prog.Add(f.Size)
	}
}

func (h *host) anyUploads() bool {
	for _, u := range h.ups {
		if u != nil {
			return true
		}
	}
	return false
}

// newUpload decides how file i is sent: whole (small), into the partial an
// earlier run left (its journaled chunks kept), or into a new one.
func (h *host) newUpload(i int, old bool) *upload {
	f := &h.p.Files[i]
	u := &upload{h: h, i: i, f: f, fr: h.fr[i], old: old, small: h.p.small(f)}
	h.idx.del(f.Rel)
	if u.small {
		return u
	}
	n := f.Chunks(h.p.ChunkSize)
	u.need = make([]bool, n)
	u.ready = make(chan struct{})
	u.written = make(chan struct{})
	u.verified = map[int]bool{}
	st := h.stateOf(f.Rel)
	pe, ok := h.listing[f.Rel+".partial"]
	if !(st.partial == f.Size && ok && pe.kind == 'f' && pe.size == f.Size) {
		st.partial, st.chunks = -1, map[int]digest.Digest{}
	}
	u.fr.Resumed = len(st.chunks) > 0
	left := 0
	for c := range u.need {
		_, have := st.chunks[c]
		u.need[c] = !have
		if !have {
			left++
		}
	}
	u.left.Store(int32(left))
	if left == 0 {
		close(u.written)
	}
	return u
}

// checkInPlace hashes the files idx (there with the right size, not
// known to be right) at the destination: those that match are skipped,
// the others sent.
func (h *host) checkInPlace(idx []int) error {
	if len(idx) == 0 {
		return nil
	}
	ctx := h.ctx
	digests := make([]digest.Digest, len(idx))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(h.o.Streams * 2)
	for k, batch := range batches(h.p, idx) {
		g.Go(func() error {
			ds, _, err := h.hashRemote(gctx, k, batch, false)
			if err != nil {
				return err
			}
			for j, i := range batch {
				digests[indexOf(idx, i)] = ds[j]
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for k, i := range idx {
		f := &h.p.Files[i]
		if digests[k] == f.Digest {
			h.skip(i, h.listing[f.Rel].mtime, false)
			continue
		}
		h.o.Log.Info("transfer: remote file differs; replacing it", "dest", h.d.Name, "file", f.Rel, "remote", digests[k], "want", f.Digest)
		h.ups[i] = h.newUpload(i, true)
	}
	return nil
}

func indexOf(xs []int, x int) int {
	return sort.SearchInts(xs, x)
}

// batches cuts the files idx (plan indexes, ascending) into groups one
// remote command hashes: up to 256 files or 256 MiB, a larger file alone
// (several commands then hash on several cores there).
func batches(p *Plan, idx []int) [][]int {
	var out [][]int
	var cur []int
	var n int64
	for _, i := range idx {
		f := &p.Files[i]
		if len(cur) > 0 && (len(cur) >= 256 || n+f.Size > 256<<20 || strings.ContainsRune(f.Rel, '\n')) {
			out = append(out, cur)
			cur, n = nil, 0
		}
		cur = append(cur, i)
		n += f.Size
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// hashRemote hashes the files batch (their partials when partial) at the
// destination: with the remote tool in one command on connection
// k%Streams, else by reading them back. mtimes are theirs as the
// destination lists them, where the command could say (else nil).
func (h *host) hashRemote(ctx context.Context, k int, batch []int, partial bool) (ds []digest.Digest, mtimes []int64, err error) {
	rels := make([]string, len(batch))
	var n int64
	for j, i := range batch {
		rels[j] = h.p.Files[i].Rel
		if partial {
			rels[j] += ".partial"
		}
		n += h.p.Files[i].Size
	}
	if h.tools.hashCmd != "" {
		return h.ep.hashFiles(ctx, k%h.conns(), h.tools, rels, n)
	}
	ds = make([]digest.Digest, len(batch))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for j, i := range batch {
		g.Go(func() error {
			d, _, err := h.ep.readBack(gctx, h.smallSlot(k+j), rels[j], h.p.Files[i].Size, h.p.ChunkSize)
			ds[j] = d
			return err
		})
	}
	return ds, nil, g.Wait()
}

// extras are the paths the destination holds under the plan's
// directories that the plan does not send (partials of files it sends
// excepted), deepest first.
func (h *host) extras() []string {
	want := map[string]bool{}
	for _, f := range h.p.Files {
		want[f.Rel] = true
		want[f.Rel+".partial"] = true
	}
	for _, l := range h.p.Links {
		want[l.Rel] = true
	}
	dirs := map[string]bool{}
	for _, d := range h.p.Dirs {
		want[d] = true
		dirs[d] = true
	}
	var out []string
	for p := range h.listing {
		top, _, _ := strings.Cut(p, "/")
		if !want[p] && dirs[top] {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := strings.Count(out[i], "/"), strings.Count(out[j], "/")
		if a != b {
			return a > b
		}
		return out[i] < out[j]
	})
	return out
}

// roomCheck refuses, before a byte is sent, a destination whose file
// system cannot hold what is left to send: each file's size, less what its
// partial already holds there (a resumed partial keeps its blocks; one
// started again is truncated, which frees them). A file that replaces an
// older one needs room for both until it is verified.
func (h *host) roomCheck() error {
	free, known, err := h.ep.space(h.ctx)
	if err != nil || !known {
		return err
	}
	var need int64
	var old []string
	for _, u := range h.ups {
		if u == nil {
			continue
		}
		need += u.f.Size
		if pe, ok := h.listing[u.f.Rel+".partial"]; ok && pe.kind == 'f' {
			switch {
			case pe.alloc >= 0:
				need -= min(pe.alloc, u.f.Size)
			case u.fr.Resumed:
				need -= int64(len(h.stateOf(u.f.Rel).chunks)) * h.p.ChunkSize
			}
		}
		if u.old {
			old = append(old, fmt.Sprintf("%s (%d bytes)", u.f.Rel, h.listing[u.f.Rel].size))
		}
	}
	// Allocation rounds up: leave a block a file of slack.
	if need <= 0 || free >= need {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s needs %d more bytes and has %d free", h.ep.where(), need, free)
	if len(old) > 0 {
		if len(old) > 5 {
			old = append(old[:5], fmt.Sprintf("and %d more", len(old)-5))
		}
		fmt.Fprintf(&b, "; the older copies there of %s are replaced only once the new ones are verified: delete them first to make room", strings.Join(old, ", "))
	}
	var stale []string
	for _, p := range h.extra {
		if strings.HasSuffix(p, ".partial") {
			stale = append(stale, p)
		}
	}
	if len(stale) > 0 {
		fmt.Fprintf(&b, "; partial files no transfer of this plan will finish: %s", strings.Join(stale[:min(5, len(stale))], ", "))
	}
	if len(old) == 0 && len(stale) == 0 {
		b.WriteString("; free space there")
	}
	return fmt.Errorf("%w: %s", ErrRemoteFull, b.String())
}

// readFile is one larger source file read for sending.
type readFile struct {
	f    *File
	sums []digest.Digest // each chunk's, as read
	sum  sync.WaitGroup  // chunk digests not computed yet
	done chan struct{}   // closed when every chunk was read and hashed
	err  error           // set before done closes: nil, or why the bytes are not the file planned
	// skipped: chunks every destination held were not read again (an
	// object's, whose digest is known): no whole-file hash of what was read.
	skipped bool
}

// job is one piece of a source file read once and written to every
// destination that lacks it.
type job struct {
	rf    *readFile // nil for a small file
	idx   int
	off   int64
	data  []byte
	sum   digest.Digest
	once  sync.Once
	refs  atomic.Int32
	bytes int64
	b     *budget
	// pooled: data is one of b's chunk buffers, returned to it on release.
	pooled bool
	// skip: a chunk not read again (every destination holds it; b is nil).
	skip bool
}

// budget bounds the bytes of source data in flight (read, not yet written
// everywhere) and keeps chunk buffers for reuse: a fresh 16 MiB buffer a
// chunk costs its page faults and zeroing again (a 1 GB file went at 50
// instead of 62 MB/s on 2 cores).
type budget struct {
	sem  *semaphore.Weighted
	free chan []byte // buffers of a chunk's size
	cs   int64
}

func newBudget(inFlight, chunkSize int64) *budget {
	return &budget{sem: semaphore.NewWeighted(inFlight), free: make(chan []byte, inFlight/chunkSize+1), cs: chunkSize}
}

// acquire takes n bytes of the budget.
func (b *budget) acquire(ctx context.Context, n int64) error { return b.sem.Acquire(ctx, max(n, 1)) }

// chunk returns a buffer of n bytes (n ≤ the chunk size) for a chunk whose
// bytes were acquired: a reused one where there is one.
func (b *budget) chunk(n int64) []byte {
	select {
	case buf := <-b.free:
		return buf[:n]
	default:
		return make([]byte, n, b.cs)
	}
}

// release gives n bytes back, and buf (from chunk, or nil) for reuse.
func (b *budget) release(buf []byte, n int64) {
	if buf != nil && int64(cap(buf)) == b.cs {
		select {
		case b.free <- buf[:b.cs]:
		default:
		}
	}
	b.sem.Release(max(n, 1))
}

// digest is the chunk's sha256, computed once by the first goroutine
// that asks.
func (j *job) digest() digest.Digest {
	j.once.Do(func() {
		s := sha256.Sum256(j.data)
		j.sum = digest.New(s[:])
		if j.rf != nil {
			j.rf.sums[j.idx] = j.sum
		}
	})
	return j.sum
}

func (j *job) release() {
	if j.refs.Add(-1) == 0 {
		var buf []byte
		if j.pooled {
			buf = j.data
		}
		j.data = nil
		if j.b != nil {
			j.b.release(buf, j.bytes)
		}
	}
}

type smallJob struct {
	u *upload
	j *job
}

type chunkJob struct {
	u *upload
	j *job
}

// Per destination, how many small files are being written at once on
// each SFTP session (each pays its round trips: open, write, close), and
// how many bytes of small files make a session worth opening.
const (
	smallPerSession      = 16
	smallBytesPerSession = 16 << 20
)

// smallSlot is the session for small-file work item k: the first
// smallSlots sessions, connection by connection.
func (h *host) smallSlot(k int) int { return k % max(h.smallSlots, 1) }

// Chunk checks during the send, at once per connection.
const verifiersPerConn = 2

// smallReaders bounds the small source files read (and hashed) at once:
// each costs an open, two fstats and a close besides its bytes, which a
// single reader paid in turn for every file of a tree, whatever the
// destinations' writers could take.
var smallReaders = 4

// send reads every file some destination needs, once, and hands it out.
func send(ctx context.Context, p *Plan, hosts []*host) {
	var active []*host
	for _, h := range live(hosts) {
		if h.anyUploads() {
			active = append(active, h)
			h.startWorkers()
		}
	}
	if len(active) == 0 {
		return
	}
	o := active[0].o
	bud := newBudget(o.InFlight, p.ChunkSize)
	hasher := newInOrder(p)
	var readers errgroup.Group
	readers.SetLimit(smallReaders)
	// Small objects are fetched many more at once: each GET is a round
	// trip.
	var objects errgroup.Group
	objects.SetLimit(srcSmallReadsS3)
	for _, i := range p.sendOrder() {
		if ctx.Err() != nil {
			break
		}
		var hs []*host
		for _, h := range active {
			if h.ups[i] != nil && h.err() == nil {
				hs = append(hs, h)
			}
		}
		if len(hs) == 0 {
			continue
		}
		f := &p.Files[i]
		switch {
		case p.small(f) && f.src != nil:
			objects.Go(func() error { readSmall(ctx, p, f, i, hs, bud); return nil })
		case p.small(f):
			readers.Go(func() error { readSmall(ctx, p, f, i, hs, bud); return nil })
		default:
			readLarge(ctx, f, i, hs, bud, hasher)
		}
	}
	readers.Wait()
	objects.Wait()
	hasher.close()
	for _, h := range active {
		close(h.smallQ)
		close(h.chunkQ)
	}
	for _, h := range active {
		h.workers.Wait()
		h.fin.Wait()
	}
}

// sendOrder is the order files are read and sent in: a file from each
// directory in turn, each directory's in plan order. Files created at once
// in one directory contend for its lock on the server (on a 16-core host,
// 5000 small files in ten directories took 14 s of sshd CPU and 2.2 s
// sent directory by directory, 1.4 s and 0.8 s taken in turn); the bytes
// that land are the same.
func (p *Plan) sendOrder() []int {
	byDir := map[string][]int{}
	var dirs []string
	for i, f := range p.Files {
		d := path.Dir(f.Rel)
		if _, ok := byDir[d]; !ok {
			dirs = append(dirs, d)
		}
		byDir[d] = append(byDir[d], i)
	}
	order := make([]int, 0, len(p.Files))
	for k := 0; len(order) < len(p.Files); k++ {
		for _, d := range dirs {
			if k < len(byDir[d]) {
				order = append(order, byDir[d][k])
			}
		}
	}
	return order
}

// readSmall reads file f (plan index i) whole and queues it to the hosts.
func readSmall(ctx context.Context, p *Plan, f *File, i int, hs []*host, b *budget) {
	if err := b.acquire(ctx, f.Size); err != nil {
		return
	}
	j := &job{data: make([]byte, f.Size), bytes: f.Size, b: b}
	j.refs.Store(int32(len(hs)))
	meta, err := readWhole(ctx, f, j.data)
	if hookSourceRead != nil {
		hookSourceRead(f.Rel, 0)
	}
	if err == nil {
		// A file with no digest yet (HashLater, an object not tagged)
		// takes that of these bytes, read between two checks of the
		// file's stamp or with If-Match of the object's ETag.
		err = checkRead(p, f, j.digest(), meta)
	}
	for _, h := range hs {
		if err != nil {
			h.failFile(f.Rel, err)
			j.release()
			continue
		}
		h.unsettled.Add(1)
		select {
		case h.smallQ <- smallJob{u: h.ups[i], j: j}:
		case <-h.ctx.Done():
			h.unsettled.Add(-1)
			j.release()
		}
	}
}

// hookSourceRead, set only by tests, is told of each piece of a source
// read for sending (a small file whole, a chunk of a larger one).
var hookSourceRead func(rel string, off int64)

// readWhole reads the file planned as f into data (its planned size),
// checking that it is still the file planned.
func readWhole(ctx context.Context, f *File, data []byte) (meta map[string]string, err error) {
	if f.src != nil {
		return f.src.readAt(ctx, data, 0)
	}
	return nil, readWholeFile(f, data)
}

func readWholeFile(f *File, data []byte) error {
	lf, err := os.Open(f.Path)
	if err != nil {
		return err
	}
	defer lf.Close()
	if err := sameStamp(lf, f); err != nil {
		return err
	}
	if _, err := lf.ReadAt(data, 0); err != nil {
		if err == io.EOF {
			return fmt.Errorf("%s: %w: shorter than %d bytes", f.Path, ErrSourceChanged, f.Size)
		}
		return fmt.Errorf("%s: %w", f.Path, err)
	}
	return sameStamp(lf, f)
}

// inOrder hashes whole files from their chunks in read order, beside the
// writers, and settles each file's verdict once its last chunk is in.
type inOrder struct {
	ch   chan *job
	done chan struct{}
}

func newInOrder(p *Plan) *inOrder {
	x := &inOrder{ch: make(chan *job, 4), done: make(chan struct{})}
	go func() {
		defer close(x.done)
		var cur *readFile
		var whole = sha256.New()
		var got int
		for j := range x.ch {
			if j.rf != cur {
				cur, got = j.rf, 0
				whole.Reset()
			}
			if !j.skip {
				whole.Write(j.data)
			}
			j.release()
			got++
			if got == len(cur.sums) {
				cur.sum.Wait()
				if cur.err == nil && !cur.skipped {
					// (Where chunks were not read again, the destinations
					// check the whole file.)
					cur.err = checkRead(p, cur.f, digest.New(whole.Sum(nil)), nil)
				}
				close(cur.done)
			}
		}
	}()
	return x
}

func (x *inOrder) close() {
	close(x.ch)
	<-x.done
}

// readLarge reads file f (plan index i) chunk by chunk and hands each
// chunk to the hosts that lack it.
func readLarge(ctx context.Context, f *File, i int, hs []*host, b *budget, hasher *inOrder) {
	cs := hs[0].p.ChunkSize
	n := f.Chunks(cs)
	rf := &readFile{f: f, sums: make([]digest.Digest, n), done: make(chan struct{})}
	for _, h := range hs {
		u := h.ups[i]
		u.rf = rf
		h.fin.Add(1)
		go u.prepare()
		go u.finish()
	}
	fail := func(err error) {
		rf.err = err
		close(rf.done)
		for _, h := range hs {
			h.failFile(f.Rel, err)
		}
	}
	if f.src != nil {
		readObjectChunks(ctx, f, i, hs, b, hasher, rf, fail)
		return
	}
	lf, err := os.Open(f.Path)
	if err != nil {
		fail(err)
		return
	}
	defer lf.Close()
	if err := sameStamp(lf, f); err != nil {
		fail(err)
		return
	}
	for idx := range n {
		var to []*host
		alive := false
		for _, h := range hs {
			if h.err() == nil {
				alive = true
				if h.ups[i].need[idx] {
					to = append(to, h)
				}
			}
		}
		if !alive {
			return
		}
		off := int64(idx) * cs
		size := min(cs, f.Size-off)
		if err := b.acquire(ctx, size); err != nil {
			fail(err)
			return
		}
		j := &job{rf: rf, idx: idx, off: off, data: b.chunk(size), bytes: size, b: b, pooled: true}
		if hookSourceRead != nil {
			hookSourceRead(f.Rel, off)
		}
		if _, err := lf.ReadAt(j.data, off); err != nil {
			b.release(j.data, size)
			if err == io.EOF {
				err = fmt.Errorf("%w: shorter than %d bytes", ErrSourceChanged, f.Size)
			}
			fail(fmt.Errorf("%s: %w", f.Path, err))
			return
		}
		if idx == n-1 {
			// Before the last chunk reaches the whole-file hash, which
			// settles the file's verdict once it has every chunk.
			rf.err = sameStamp(lf, f)
		}
		// Held by the writers, the whole-file hash, and the chunk's own
		// digest (computed beside the reading).
		j.refs.Store(int32(len(to)) + 2)
		rf.sum.Add(1)
		go func() { j.digest(); rf.sum.Done(); j.release() }()
		hasher.ch <- j
		for _, h := range to {
			select {
			case h.chunkQ <- chunkJob{u: h.ups[i], j: j}:
			case <-h.ctx.Done():
				j.release()
			}
		}
	}
}

// startWorkers starts the destination's writers and checkers.
func (h *host) startWorkers() {
	slots := h.o.Streams * h.o.Sessions
	h.smallQ = make(chan smallJob, slots)
	h.chunkQ = make(chan chunkJob)
	h.settleQ = make(chan *upload, slots*smallPerSession)
	h.vsem = make(chan struct{}, h.o.Streams*verifiersPerConn)
	// Many small files in flight on each session they use, their checks
	// batched. They use a session per smallBytesPerSession of them, the
	// first connection's sessions first: a few small files open one
	// connection, not Streams.
	var smallBytes int64
	for _, u := range h.ups {
		switch {
		case u == nil:
		case u.small:
			smallBytes += u.f.Size
		default:
			h.large = true
		}
	}
	h.smallSlots = int(min(int64(slots), max(1, (smallBytes+smallBytesPerSession-1)/smallBytesPerSession)))
	writers := h.smallSlots * smallPerSession
	if h.d.Local {
		// No round trip to hide: more writers only contend for the
		// directories' locks in the kernel (on the 16-core device, 2 to
		// 160 writers took the same time within its noise, 1.06–1.60 s
		// for 5000 files, and 160 of them burnt the most system CPU).
		writers = min(writers, localSmallWriters)
	}
	var small sync.WaitGroup
	for w := range writers {
		small.Go(func() {
			for sj := range h.smallQ {
				h.writeSmall(sj, h.smallSlot(w))
			}
		})
	}
	var settler sync.WaitGroup
	settler.Go(h.settleLoop)
	h.workers.Go(func() {
		small.Wait()
		close(h.settleQ)
		settler.Wait()
	})
	for w := range slots {
		h.workers.Go(func() {
			for cj := range h.chunkQ {
				h.writeChunkJob(cj, w)
			}
		})
	}
}

// batchesPerConn is how many batches of small files are checked at once
// on each stream's connection, and maxBatch how many files one holds at
// most (and 64 MiB): large enough that a check's remote command (a
// session, two shells, sync, the hash tool, stat: about 100 ms of CPU on
// the 2-core VM the benchmarks ran on, a few ms on a server) is spread
// over many files, small enough that the checks keep up with the writes.
// A batch is checked when it is full, when no other small file is being
// written, or batchWait after its first file.
const (
	batchesPerConn = 1
	maxBatch       = 1024
	maxBatchBytes  = 64 << 20
	batchWait      = 500 * time.Millisecond
)

// writeSmall writes a small file into its partial and queues its check.
func (h *host) writeSmall(sj smallJob, slot int) {
	defer sj.j.release()
	queued := false
	defer func() {
		if !queued {
			h.unsettled.Add(-1)
		}
	}()
	if h.err() != nil {
		return
	}
	u := sj.u
	t := time.Now()
	var err error
	same, mtime := false, int64(-1)
	if c, ok := h.ep.(smallChecker); ok {
		same, mtime, err = c.putSmallChecked(h.ctx, slot, u.f.Rel, u.f.Perm, sj.j.data, h.prog)
	} else {
		err = h.ep.putSmall(h.ctx, slot, u.f.Rel, sj.j.data, h.tools.hashCmd == "" || !h.tools.syncfs, h.prog)
	}
	u.fr.Seconds += time.Since(t).Seconds()
	if err != nil {
		h.fail(u.f.Rel, err)
		return
	}
	h.sent.Add(u.f.Size)
	u.fr.Sent += u.f.Size
	u.fr.Chunks++
	if same {
		// Read back as written: renamed into place here, no batch.
		if err := h.commit(h.ctx, slot, u, mtime, true, false); err != nil {
			h.fail(u.f.Rel, err)
		}
		return
	}
	queued = true
	select {
	case h.settleQ <- u:
	case <-h.ctx.Done():
		h.unsettled.Add(-1)
	}
}

// smallChecker is an endpoint that reads a small file back as it writes
// it, where a batched check would save no round trip (a local directory):
// the partial gets mode perm, same says the bytes read back are data
// (whose sha256 is the file's digest), mtime is the partial's. A file read
// back otherwise goes to the batched check, which finds and repairs what
// differs.
type smallChecker interface {
	putSmallChecked(ctx context.Context, slot int, rel string, perm fs.FileMode, data []byte, prog progress.Reporter) (same bool, mtime int64, err error)
}

// settleLoop gathers written small files into batches and hands each to
// one of the checkers: a batch is every file written since the last one
// left, sent when it is full, when no other small file is being written,
// or batchWait after its first file (one gatherer, so that files written
// at once share a command).
func (h *host) settleLoop() {
	batches := make(chan []*upload)
	var checkers sync.WaitGroup
	for k := range h.o.Streams * batchesPerConn {
		checkers.Go(func() {
			for batch := range batches {
				if h.err() == nil {
					if err := h.settle(k, batch); err != nil {
						h.fail(errFile(batch, err), err)
					}
				}
			}
		})
	}
	defer checkers.Wait()
	defer close(batches)
	var batch []*upload
	var n int64
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	flush := func() {
		if len(batch) > 0 {
			batches <- batch
		}
		batch, n = nil, 0
		timer.Stop()
	}
	for {
		select {
		case u, ok := <-h.settleQ:
			if !ok {
				flush()
				return
			}
			if len(batch) == 0 {
				timer.Reset(batchWait)
			}
			batch = append(batch, u)
			n += u.f.Size
			// Nothing else is being written: no more is coming soon.
			if h.unsettled.Add(-1) == 0 || len(batch) >= maxBatch || n >= maxBatchBytes {
				flush()
			}
		case <-timer.C:
			flush()
		}
	}
}

// fileError is an error about one file of a batch.
type fileError struct {
	rel string
	err error
}

func (e *fileError) Error() string { return e.err.Error() }
func (e *fileError) Unwrap() error { return e.err }

func errFile(batch []*upload, err error) string {
	var fe *fileError
	if errors.As(err, &fe) {
		return fe.rel
	}
	if len(batch) == 1 {
		return batch[0].f.Rel
	}
	return ""
}

// settle checks a batch of small files written into their partials: one
// remote command hashes them all (or they are read back); those that
// match are renamed into place, the others read back (a tool that
// misreports is an error, not a reason to send again) and sent again, at
// most twice.
func (h *host) settle(k int, batch []*upload) error {
	ctx := h.ctx
	idx := make([]int, len(batch))
	for j, u := range batch {
		idx[j] = u.i
	}
	ds, mtimes, err := h.hashRemote(ctx, k, idx, true)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		if len(batch) == 1 {
			return &fileError{batch[0].f.Rel, fmt.Errorf("verifying %s.partial: %w", h.ep.remote(batch[0].f.Rel), err)}
		}
		// One file of the batch may be the trouble: each on its own.
		for _, u := range batch {
			if err := h.settle(k, []*upload{u}); err != nil {
				return err
			}
		}
		return nil
	}
	return h.commitAll(k, batch, ds, mtimes, false)
}

// commitAll renames the partials of a batch of small files into place,
// those whose digest ds[j] is the file's at once, the others after
// repairSmall made them right; mtimes (nil: unknown) are theirs at the
// destination, modeSet says the partials have their mode already.
func (h *host) commitAll(k int, batch []*upload, ds []digest.Digest, mtimes []int64, modeSet bool) error {
	g, gctx := errgroup.WithContext(h.ctx)
	g.SetLimit(64)
	for j, u := range batch {
		g.Go(func() error {
			mtime := int64(-1) // unknown
			if mtimes != nil {
				mtime = mtimes[j]
			}
			set := modeSet
			if ds[j] != u.f.Digest {
				if err := h.repairSmall(gctx, k+j, u, ds[j]); err != nil {
					return &fileError{u.f.Rel, err}
				}
				mtime, set = -1, false
			}
			if err := h.commit(gctx, k+j, u, mtime, set, false); err != nil {
				return &fileError{u.f.Rel, err}
			}
			return nil
		})
	}
	err := g.Wait()
	if serr := h.syncJournal(); err == nil {
		err = serr
	}
	return err
}

// repairSmall handles a small file whose partial hashed to got: read back,
// it is either what was sent (the tool lies) or not (sent again, checked
// alone, up to twice).
func (h *host) repairSmall(ctx context.Context, k int, u *upload, got digest.Digest) error {
	f := u.f
	slot := h.smallSlot(k)
	for round := 0; ; round++ {
		if h.tools.hashCmd != "" {
			d, _, err := h.ep.readBack(ctx, slot, f.Rel+".partial", f.Size, h.p.ChunkSize)
			if err != nil {
				return err
			}
			if d == f.Digest {
				return fmt.Errorf("%w: %q says %s.partial is %s, but its bytes read back over SFTP are %s, the source's digest",
					ErrRemoteHash, h.tools.hashCmd, h.ep.remote(f.Rel), got.Short(), f.Digest.Short())
			}
		}
		if round >= 2 {
			return fmt.Errorf("%w: %s.partial still differs after sending it again twice", ErrVerify, h.ep.remote(f.Rel))
		}
		h.o.Log.Warn("transfer: remote file differs from what was sent; sending it again", "dest", h.d.Name, "file", f.Rel)
		data := make([]byte, f.Size)
		if _, err := readWhole(ctx, f, data); err != nil {
			return err
		}
		if s := sha256.Sum256(data); digest.New(s[:]) != f.Digest {
			return fmt.Errorf("%s: %w", f.Path, ErrSourceChanged)
		}
		if err := h.ep.putSmall(ctx, slot, f.Rel, data, true, nil); err != nil {
			return err
		}
		h.sent.Add(f.Size)
		u.fr.Sent += f.Size
		u.fr.Repaired++
		ds, _, err := h.hashRemote(ctx, k, []int{u.i}, true)
		if err != nil {
			return err
		}
		if got = ds[0]; got == f.Digest {
			return nil
		}
	}
}

// commit renames u's verified partial into place and records it with its
// mtime at the destination (mtime < 0: not known yet, asked for).
func (h *host) commit(ctx context.Context, k int, u *upload, mtime int64, modeSet, syncJournal bool) error {
	f := u.f
	// What was sent is the file planned (its digest was checked as it was
	// read); a source changed since would leave the destination with what
	// the user no longer has.
	if f.src != nil {
		// An object: every read was of the version planned (If-Match).
	} else if now, err := fsutil.StatStamp(f.Path); err != nil || now != f.Stamp {
		if err == nil {
			err = fmt.Errorf("%s: %w (size %d → %d, mtime changed: %v)", f.Path, ErrSourceChanged, f.Stamp.Size, now.Size, now.MtimeNs != f.Stamp.MtimeNs)
		}
		return err
	}
	slot := h.smallSlot(k)
	if !u.small {
		slot = h.ep.slotOf(k)
	}
	got, err := h.ep.commit(ctx, slot, f.Rel, f.Perm, modeSet, mtime < 0)
	if err != nil {
		return err
	}
	if mtime < 0 {
		mtime = got
	}
	u.fr.Verified, u.fr.Digest = true, f.Digest
	h.bytes.Add(f.Size)
	h.idx.put(f.Rel, indexEntry{Size: f.Size, Mtime: mtime, Digest: f.Digest})
	l := jDone{rel: f.Rel, digest: f.Digest, size: f.Size, mtime: mtime}
	if syncJournal {
		return h.journal(l)
	}
	return h.journalNoSync(l)
}

// prepare makes u's partial ready for its chunks: kept as an earlier run
// left it, or made anew (journaled first: the new partial line drops the
// chunk lines of any earlier one, so a kill from there on leaves none that
// the new, zeroed partial contradicts).
func (u *upload) prepare() {
	h := u.h
	defer close(u.ready)
	st := h.stateOf(u.f.Rel)
	if st.partial == u.f.Size {
		return
	}
	err := h.journal(jPartial{rel: u.f.Rel, size: u.f.Size})
	if err == nil {
		err = h.ep.createPartial(h.ctx, h.ep.slotOf(u.i), u.f.Rel, u.f.Size)
	}
	if err == nil && hookPartialCreated != nil {
		err = hookPartialCreated(u.f.Rel)
	}
	if err != nil {
		u.readyErr = err
		h.fail(u.f.Rel, err)
		return
	}
	h.jmu.Lock()
	st.partial = u.f.Size
	h.jmu.Unlock()
}

// hookPartialCreated, set only by tests, runs right after a partial was
// created: an error from it ends the run there, as a kill at that point
// would.
var hookPartialCreated func(rel string) error

// writeChunkJob writes one chunk from session slot, journals it, and
// queues its check on the remote host.
func (h *host) writeChunkJob(cj chunkJob, slot int) {
	u, j := cj.u, cj.j
	defer j.release()
	select {
	case <-u.ready:
	case <-h.ctx.Done():
		return
	}
	if u.readyErr != nil || h.err() != nil {
		return
	}
	h.o.Log.Debug("transfer: sending chunk", "dest", h.d.Name, "file", u.f.Rel, "chunk", j.idx, "offset", j.off, "bytes", len(j.data))
	t := time.Now()
	err := h.ep.writeChunk(h.ctx, slot, u.f.Rel, j.off, j.data, j.digest, h.prog)
	if err != nil {
		h.fail(u.f.Rel, err)
		return
	}
	sum := j.digest()
	h.sent.Add(int64(len(j.data)))
	st := h.stateOf(u.f.Rel)
	h.jmu.Lock()
	st.chunks[j.idx] = sum
	u.fr.Sent += int64(len(j.data))
	u.fr.Chunks++
	u.fr.Seconds += time.Since(t).Seconds()
	h.jmu.Unlock()
	if err := h.journal(jChunk{rel: u.f.Rel, chunk: j.idx, end: j.off + int64(len(j.data)), digest: sum}); err != nil {
		h.fail(u.f.Rel, err)
		return
	}
	if h.tools.ranges {
		u.vwg.Add(1)
		go func() {
			defer u.vwg.Done()
			select {
			case h.vsem <- struct{}{}:
			case <-h.ctx.Done():
				return
			}
			defer func() { <-h.vsem }()
			d, err := h.ep.rangeHash(h.ctx, j.idx%h.o.Streams, h.tools, u.f.Rel+".partial", h.p.ChunkSize, j.idx, false)
			if err == nil && d == sum {
				u.vmu.Lock()
				u.verified[j.idx] = true
				u.vmu.Unlock()
			}
		}()
	}
	if u.left.Add(-1) == 0 {
		close(u.written)
	}
}

// finish verifies u's partial once every chunk is written and the file's
// bytes, as read, are known to be the file planned; re-sends the chunks
// that differ; and renames it into place.
func (u *upload) finish() {
	h := u.h
	defer h.fin.Done()
	// The read first: one that failed midway leaves chunks unwritten.
	select {
	case <-u.rf.done:
	case <-h.ctx.Done():
		return
	}
	if u.rf.err == nil {
		select {
		case <-u.written:
		case <-h.ctx.Done():
			return
		}
	}
	<-u.ready
	if u.readyErr != nil || h.err() != nil {
		return
	}
	f := u.f
	if u.rf.err != nil {
		if errors.Is(u.rf.err, ErrSourceChanged) || errors.Is(u.rf.err, ErrSourceDigest) {
			// The chunks sent are not of the file planned: none of them is
			// worth keeping.
			h.forget(f.Rel)
		}
		h.failFile(f.Rel, u.rf.err)
		return
	}
	u.vwg.Wait()
	h.ep.closePartial(f.Rel)
	t := time.Now()
	var err error
	// Chunks not read again were checked by their journaled digests
	// alone: the whole file is hashed where it landed, where that can be.
	if h.tools.ranges && !(u.rf.skipped && h.tools.hashCmd != s3Verifier) {
		err = h.finishByChunks(u)
	} else {
		err = h.finishWhole(u)
	}
	if err == nil {
		err = h.commit(h.ctx, u.i, u, -1, false, true)
	}
	u.fr.Seconds += time.Since(t).Seconds()
	if err != nil {
		h.fail(f.Rel, err)
	}
}

// forget drops what the journal holds of rel's partial, whose chunks are
// not of the file planned.
func (h *host) forget(rel string) {
	st := h.stateOf(rel)
	h.jmu.Lock()
	st.chunks = map[int]digest.Digest{}
	st.partial = -1
	h.jmu.Unlock()
	h.journal(jPartial{rel: rel, size: -1})
}

// finishByChunks is finish where the remote host hashes chunks: every
// chunk not checked during the send is hashed there, many at once, and
// compared with the digests of what was read; the chunks that differ are
// read back over SFTP (a tool that misreports is an error, not a reason to
// send again) and re-sent, at most twice.
func (h *host) finishByChunks(u *upload) error {
	f := u.f
	sums := u.rf.sums
	var todo []int
	u.vmu.Lock()
	for i := range sums {
		if !u.verified[i] {
			todo = append(todo, i)
		}
	}
	u.vmu.Unlock()
	part := h.ep.remote(f.Rel) + ".partial"
	for round := 0; ; round++ {
		bad, err := h.checkChunks(u, todo, sums)
		if err != nil {
			return fmt.Errorf("verifying %s: %w", part, err)
		}
		if len(bad) == 0 {
			return nil
		}
		if round >= 2 {
			return fmt.Errorf("%w: %s still differs in %d chunks after re-sending them twice", ErrVerify, part, len(bad))
		}
		var wrong []int
		for _, i := range bad {
			d, err := h.ep.readBackChunk(h.ctx, h.ep.slotOf(u.i), f.Rel, f.Size, h.p.ChunkSize, i)
			if err != nil {
				return err
			}
			if d != sums[i] {
				wrong = append(wrong, i)
			}
		}
		if len(wrong) == 0 {
			return fmt.Errorf("%w: %q says %d chunks of %s differ from the source, but their bytes read back over SFTP are the source's",
				ErrRemoteHash, h.rep.HashCommand, len(bad), part)
		}
		h.o.Log.Warn("transfer: remote chunks differ; sending them again", "dest", h.d.Name, "file", f.Rel, "chunks", len(wrong))
		for _, i := range wrong {
			if err := h.resend(u, i, sums[i]); err != nil {
				return err
			}
		}
		todo = wrong
	}
}

// checkChunks hashes chunks idx of u's partial on the remote host, several
// at once on every connection, and returns those whose digest is not
// sums[i], in order.
func (h *host) checkChunks(u *upload, idx []int, sums []digest.Digest) ([]int, error) {
	bad := make([]bool, len(sums))
	g, gctx := errgroup.WithContext(h.ctx)
	g.SetLimit(h.o.Streams * max(1, min(4, maxExecPerConn-h.o.Sessions)))
	for k, i := range idx {
		g.Go(func() error {
			d, err := h.ep.rangeHash(gctx, k%h.o.Streams, h.tools, u.f.Rel+".partial", h.p.ChunkSize, i, true)
			if err != nil {
				return err
			}
			bad[i] = d != sums[i]
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	var out []int
	for _, i := range idx {
		if bad[i] {
			out = append(out, i)
		}
	}
	return out, nil
}

// finishWhole is finish where the remote host cannot hash chunks: the
// whole partial is hashed there (or read back), and where it differs its
// chunks are read back and compared with the journal's.
func (h *host) finishWhole(u *upload) error {
	f := u.f
	st := h.stateOf(f.Rel)
	part := h.ep.remote(f.Rel) + ".partial"
	n := f.Chunks(h.p.ChunkSize)
	slot := h.ep.slotOf(u.i)
	for round := 0; ; round++ {
		var d digest.Digest
		var chunks []digest.Digest
		var err error
		if h.tools.hashCmd != "" {
			var ds []digest.Digest
			if ds, _, err = h.ep.hashFiles(h.ctx, u.i%h.o.Streams, h.tools, []string{f.Rel + ".partial"}, f.Size); err == nil {
				d = ds[0]
			}
		} else {
			d, chunks, err = h.ep.readBack(h.ctx, slot, f.Rel+".partial", f.Size, h.p.ChunkSize)
		}
		if err != nil {
			return fmt.Errorf("verifying %s: %w", part, err)
		}
		if d == f.Digest {
			return nil
		}
		toolSaid := d
		if chunks == nil {
			if d, chunks, err = h.ep.readBack(h.ctx, slot, f.Rel+".partial", f.Size, h.p.ChunkSize); err != nil {
				return err
			}
		}
		var bad []int
		for i := 0; i < n; i++ {
			if want, ok := st.chunks[i]; !ok || chunks[i] != want {
				bad = append(bad, i)
			}
		}
		switch {
		case len(bad) == 0 && d == f.Digest:
			return fmt.Errorf("%w: %q says %s is %s, but its bytes read back over SFTP are %s, the source's digest",
				ErrRemoteHash, h.tools.hashCmd, part, toolSaid.Short(), f.Digest.Short())
		case len(bad) == 0:
			// What was sent is what is there, but it is not the file
			// that was hashed: the source changed.
			h.forget(f.Rel)
			return fmt.Errorf("%s: %w: the chunks sent hash to %s, the file was %s when planned", f.Path, ErrSourceChanged, d.Short(), f.Digest.Short())
		case round >= 2:
			return fmt.Errorf("%w: %s still differs in %d chunks after re-sending them twice", ErrVerify, part, len(bad))
		}
		h.o.Log.Warn("transfer: remote chunks differ; sending them again", "dest", h.d.Name, "file", f.Rel, "chunks", len(bad))
		for _, i := range bad {
			if err := h.resend(u, i, st.chunks[i]); err != nil {
				return err
			}
		}
	}
}

// resend reads chunk i of u's file again and writes it (a repair). want is
// the chunk's digest as sent or read before ("": unknown): other bytes
// now mean the source changed.
func (h *host) resend(u *upload, i int, want digest.Digest) error {
	f := u.f
	off := int64(i) * h.p.ChunkSize
	data := make([]byte, min(h.p.ChunkSize, f.Size-off))
	if err := readChunk(h.ctx, f, off, data); err != nil {
		return err
	}
	s := sha256.Sum256(data)
	sum := digest.New(s[:])
	if want != "" && want != sum {
		return fmt.Errorf("%s: %w: chunk %d at offset %d", f.Path, ErrSourceChanged, i, off)
	}
	if err := h.ep.rewriteChunk(h.ctx, h.ep.slotOf(u.i), f.Rel, off, data, func() digest.Digest { return sum }); err != nil {
		return err
	}
	h.sent.Add(int64(len(data)))
	st := h.stateOf(f.Rel)
	h.jmu.Lock()
	u.fr.Sent += int64(len(data))
	u.fr.Repaired++
	st.chunks[i] = sum
	h.jmu.Unlock()
	return h.journal(jChunk{rel: f.Rel, chunk: i, end: off + int64(len(data)), digest: sum})
}

func readChunk(ctx context.Context, f *File, off int64, data []byte) error {
	if f.src != nil {
		_, err := f.src.readAt(ctx, data, off)
		return err
	}
	lf, err := os.Open(f.Path)
	if err != nil {
		return err
	}
	defer lf.Close()
	if _, err := lf.ReadAt(data, off); err != nil {
		if err == io.EOF {
			return fmt.Errorf("%s: %w: shorter than %d bytes", f.Path, ErrSourceChanged, f.Size)
		}
		return fmt.Errorf("%s: %w", f.Path, err)
	}
	return nil
}

// sameStamp checks that the open source file is still the one planned.
func sameStamp(lf *os.File, f *File) error {
	fi, err := lf.Stat()
	if err != nil {
		return err
	}
	if now := fsutil.StampOf(fi); now != f.Stamp {
		return fmt.Errorf("%s: %w (size %d → %d, mtime changed: %v)", f.Path, ErrSourceChanged, f.Stamp.Size, now.Size, now.MtimeNs != f.Stamp.MtimeNs)
	}
	return nil
}

// end makes the plan's links and deals with what the plan does not hold.
func (h *host) end() error {
	ctx := h.ctx
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	var mu sync.Mutex
	for k, l := range h.p.Links {
		g.Go(func() error {
			e := h.listing[l.Rel]
			if e.kind != 'l' || e.target != l.Target {
				if err := h.ep.symlink(gctx, h.ep.metaSlot(k), l.Rel, l.Target, e); err != nil {
					return &fileError{l.Rel, err}
				}
			}
			mu.Lock()
			h.rep.Links = append(h.rep.Links, l.Rel)
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		var fe *fileError
		if errors.As(err, &fe) {
			h.fail(fe.rel, fe.err)
			return nil
		}
		return err
	}
	sort.Strings(h.rep.Links)
	h.rep.Extra = h.extra
	if !h.o.DeleteExtra || len(h.extra) == 0 {
		return nil
	}
	// Deepest first: a directory is empty of its extras when removed.
	for k, p := range h.extra {
		if err := h.ep.remove(ctx, h.ep.metaSlot(k), p, h.listing[p].kind == 'd'); err != nil {
			return err
		}
		h.idx.del(p)
		h.rep.Deleted = append(h.rep.Deleted, p)
	}
	return nil
}

func (h *host) report() HostReport {
	r := h.rep
	r.Sent = h.sent.Load()
	r.Bytes = h.bytes.Load()
	r.Seconds = time.Since(h.start).Seconds()
	r.MBps = mbps(r.Sent, r.Seconds)
	r.Requests, r.Commands = h.ep.counts()
	for i, fr := range h.fr {
		if fr.Digest == "" {
			fr.Digest = h.p.Files[i].Digest // learnt as it was read
		}
		fr.MBps = mbps(fr.Sent, fr.Seconds)
		r.Files = append(r.Files, *fr)
	}
	if e := h.result(); e != nil {
		r.Error = e.Error()
	}
	return r
}

func mbps(n int64, s float64) float64 {
	if s <= 0 {
		return 0
	}
	return float64(int64(float64(n)/s/1e4)) / 100 // two decimals
}

// live is the hosts that have not failed.
func live(hosts []*host) []*host {
	var out []*host
	for _, h := range hosts {
		if h.err() == nil {
			out = append(out, h)
		}
	}
	return out
}

// each runs f for every host at once and waits.
func each(hosts []*host, f func(h *host)) {
	var wg sync.WaitGroup
	for _, h := range hosts {
		wg.Go(func() { f(h) })
	}
	wg.Wait()
}
