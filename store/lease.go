package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/fsutil"
)

// A lease says that one machine is making something (a stage key) so
// that others wait instead of making it too. It is the object
// leases/<name>:
//
//   - acquired by a create-only write;
//   - renewed every ttl/3 by a write that replaces exactly the holder's
//     last version (If-Match);
//   - expired when the storage's clock says it was last written more than
//     its ttl ago (the response's Date minus the object's Last-Modified:
//     one clock, whatever the machines' clocks say), and then taken over
//     by a write that replaces exactly the expired version, so that of
//     several machines taking it over at once one wins;
//   - released by a write of released: true (If-Match), which any
//     machine may take over at once.
//
// A holder that cannot renew before its ttl runs out, or finds its
// version replaced, has lost the lease: its context is cancelled and Err
// says why. Leases save work, they do not make results right: a stage
// that runs twice writes the same blobs, and the first record stands.

// LeaseInfo is a lease object's content.
type LeaseInfo struct {
	Holder   string `json:"holder"` // the machine's name
	ID       string `json:"id"`     // random, per acquisition
	TTLMs    int64  `json:"ttl_ms"`
	Seq      int64  `json:"seq"` // renewals
	Released bool   `json:"released,omitempty"`
	// Blobs are the blobs the holder stored for what it is making, before
	// a record names them: gc keeps them while the lease is live.
	Blobs []digest.Digest `json:"blobs,omitempty"`
	// Unreadable: the object does not parse (read as released, so that
	// a stage can take it over; gc, which cannot tell what it protected,
	// waits until it is older than its grace period).
	Unreadable bool `json:"-"`
}

// TTL is the lease's ttl.
func (i LeaseInfo) TTL() time.Duration { return time.Duration(i.TTLMs) * time.Millisecond }

// How a lease was taken over (Lease.Took).
const (
	TookReleased = "released"
	TookExpired  = "expired"
	TookResumed  = "resumed"
)

// liveLeases are the leases a process holds, by name.
type liveLeases struct {
	mu sync.Mutex
	m  map[string]*Lease
}

// leaseJournal is the file that holds the id of lease name while this
// cache's process holds it (Options.ResumeLeases).
func (s *Store) leaseJournal(name string) string {
	h := sha256.Sum256([]byte(name))
	return filepath.Join(s.opt.CacheDir, "leases", hex.EncodeToString(h[:16]))
}

// resumable says whether the lease name with id was taken by an earlier
// process with this cache (its journal holds id) that is gone: no lease
// of this process holds it.
func (s *Store) resumable(name, id string) bool {
	if !s.opt.ResumeLeases {
		return false
	}
	s.live.mu.Lock()
	l := s.live.m[name]
	s.live.mu.Unlock()
	if l != nil {
		return false
	}
	b, err := os.ReadFile(s.leaseJournal(name))
	return err == nil && string(b) == id
}

// ErrLeaseHeld reports a lease another holder has and renews.
var ErrLeaseHeld = errors.New("store: lease held")

// ErrLeaseLost reports a lease its holder could no longer renew or found
// taken over.
var ErrLeaseLost = errkind.New(errkind.Retryable, "store: lease lost")

// HeldError says who holds a lease and until when.
type HeldError struct {
	Name   string
	Holder string
	// Until is when the lease ends unless renewed, on this machine's
	// clock (its remaining time by the storage's clock, from now).
	Until time.Time
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("lease %s held by %s until %s", e.Name, e.Holder, e.Until.Format(time.RFC3339))
}

func (e *HeldError) Unwrap() error { return ErrLeaseHeld }

// Lease is a held lease.
type Lease struct {
	s    *Store
	name string
	ttl  time.Duration

	// TakenFrom names the holder whose expired or released lease this
	// one took over ("" for a fresh one); Took says how: TookReleased,
	// TookExpired, or TookResumed (a lease this cache's killed earlier
	// process held: Options.ResumeLeases).
	TakenFrom string
	Took      string

	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   chan struct{}
	done   chan struct{}

	// wmu serialises the holder's writes (renewals, Protect, Release):
	// each replaces exactly the version the one before it wrote.
	wmu    sync.Mutex
	info   LeaseInfo
	etag   string
	unsure *unsureWrite // the last write, when its outcome is unknown
	marks  []markAt     // the marks written (Mark), removed by Release

	released atomic.Bool
}

// write replaces the lease object with change applied to its content,
// If-Match the holder's last version.
func (l *Lease) write(ctx context.Context, change func(*LeaseInfo)) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	for retried := false; ; retried = true {
		next := l.info
		next.Blobs = append([]digest.Digest(nil), l.info.Blobs...)
		change(&next)
		next.Seq++
		body, _ := json.Marshal(next)
		in, err := l.s.b.Put(ctx, leaseKey(l.name), body, PutOptions{IfMatch: l.etag})
		if err == nil {
			l.info, l.etag, l.unsure = next, in.ETag, nil
			return nil
		}
		if !errors.Is(err, ErrPrecondition) {
			// No answer, or a failed one: the write may have landed.
			l.unsure = &unsureWrite{info: next, body: body}
			return err
		}
		// The version is not the one this holder last knew. It is still
		// the holder's if it is exactly what it wrote: this write, whose
		// answer was lost and which was sent again (the SDK's retries),
		// or an earlier one whose answer never came (then this write is
		// made again on top of it).
		raw, cin, rerr := l.s.b.Get(ctx, leaseKey(l.name), maxLeaseBytes)
		switch {
		case rerr != nil:
			return err
		case bytes.Equal(raw, body):
			l.info, l.etag, l.unsure = next, cin.ETag, nil
			return nil
		case l.unsure != nil && bytes.Equal(raw, l.unsure.body) && !retried:
			l.info, l.etag, l.unsure = l.unsure.info, cin.ETag, nil
			continue
		}
		return err
	}
}

// unsureWrite is a lease write whose outcome is not known (its answer
// never came): it may be the version the storage holds.
type unsureWrite struct {
	info LeaseInfo
	body []byte
}

// Protect records blobs the holder is storing (or reusing, already
// stored) for what it is making, so that gc keeps them while the lease is
// live, before a record names them. Call it before looking whether they
// are stored: it then waits while a gc runs (holds its lease), so that a
// gc that read the leases before this write, and may be deleting a blob
// it found unreferenced, ends before the caller takes that blob for
// stored.
func (l *Lease) Protect(ctx context.Context, ds ...digest.Digest) error {
	return l.protect(ctx, false, ds)
}

// ProtectOnly is Protect that first drops the blobs protected before (a
// copy moving from one record to the next: those a record names now are
// kept by it).
func (l *Lease) ProtectOnly(ctx context.Context, ds ...digest.Digest) error {
	return l.protect(ctx, true, ds)
}

func (l *Lease) protect(ctx context.Context, only bool, ds []digest.Digest) error {
	if err := l.Err(); err != nil {
		return err
	}
	err := l.write(ctx, func(i *LeaseInfo) {
		if only {
			i.Blobs = nil
		}
		// Once each: a blob protected before it was stored (a stage's
		// outputs stored as it makes them) is named again with the rest.
		have := make(map[digest.Digest]bool, len(i.Blobs)+len(ds))
		for _, d := range i.Blobs {
			have[d] = true
		}
		for _, d := range ds {
			if !have[d] {
				have[d] = true
				i.Blobs = append(i.Blobs, d)
			}
		}
	})
	if errors.Is(err, ErrPrecondition) || errors.Is(err, ErrNotFound) {
		err = fmt.Errorf("%s: lease %s: %s: %w", l.s.b, l.name, l.lostHow(ctx, err), ErrLeaseLost)
		l.cancel(err)
	}
	if err != nil {
		return err
	}
	return l.s.waitGC(ctx, l.ttl)
}

// WaitGC waits while a gc holds its lease (on any machine): a writer
// that pointed a ref at an old record then finds it there, or pruned by
// a gc that read the refs before.
func (s *Store) WaitGC(ctx context.Context) error { return s.waitGC(ctx, time.Second) }

// waitGC waits while another machine's gc holds its lease, looking again
// every poll (at most a second).
func (s *Store) waitGC(ctx context.Context, poll time.Duration) error {
	poll = min(max(poll/4, 10*time.Millisecond), time.Second)
	for {
		_, until, live, err := s.LeaseStatus(ctx, gcLease)
		if errors.Is(err, ErrNotFound) || err == nil && !live {
			return nil
		}
		if err != nil {
			return err
		}
		select {
		case <-time.After(min(poll, max(time.Until(until), 10*time.Millisecond))):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Pin takes a lease of its own (pin/<host>-<random>) for a writer that
// protects blobs outside a stage's lease (a copy between stores).
// Release it when the records are written.
func (s *Store) Pin(ctx context.Context, ttl time.Duration) (*Lease, error) {
	var id [8]byte
	rand.Read(id[:])
	host := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_' {
			return r
		}
		return '_'
	}, s.opt.Host)
	if len(host) > 64 {
		host = host[:64]
	}
	return s.AcquireLease(ctx, "pin/"+host+"-"+hex.EncodeToString(id[:]), max(ttl, s.MinLeaseTTL()))
}

func leaseKey(name string) string { return "leases/" + name }

// AcquireLease takes the lease name for ttl, or returns a *HeldError (errors.Is
// ErrLeaseHeld) when another holder has it. The lease is renewed until
// Release, or until ctx is done: a holder whose ctx ends without Release
// leaves the lease to expire, as a machine that died would.
func (s *Store) AcquireLease(ctx context.Context, name string, ttl time.Duration) (*Lease, error) {
	if err := checkName("lease", name); err != nil {
		return nil, err
	}
	if min := s.MinLeaseTTL(); ttl < min {
		return nil, fmt.Errorf("%s: lease ttl %v is too short: at least %v there", s.b, ttl, min)
	}
	var id [16]byte
	rand.Read(id[:])
	info := LeaseInfo{Holder: s.opt.Host, ID: hex.EncodeToString(id[:]), TTLMs: ttl.Milliseconds()}
	body, _ := json.Marshal(info)
	key := leaseKey(name)
	// A write whose answer was lost (and that the SDK sent again, to a
	// 412) may still have landed: the lease read back then holds this
	// acquisition's id. Its time is taken as the first write's, the
	// earliest it can have been written (the holder gives up early, not
	// late), and from (fromTook) as the holder a takeover of ours replaced.
	var first time.Time
	from, fromTook := "", ""
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		sent := time.Now()
		if first.IsZero() {
			first = sent
		}
		in, err := s.b.Put(ctx, key, body, PutOptions{IfNoneMatch: true})
		if err == nil {
			return s.startLease(ctx, name, ttl, info, in.ETag, "", sent), nil
		}
		if !errors.Is(err, ErrPrecondition) {
			// No answer: the write may have landed all the same.
			if cur, cin, rerr := s.readLease(ctx, name); rerr == nil && cur.ID == info.ID {
				l := s.startLease(ctx, name, ttl, info, cin.ETag, from, first)
				l.Took = fromTook
				return l, nil
			}
			return nil, err
		}
		cur, cin, err := s.readLease(ctx, name)
		if errors.Is(err, ErrNotFound) {
			continue // deleted in between: create again
		}
		if err != nil {
			return nil, err
		}
		if cur.ID == info.ID {
			l := s.startLease(ctx, name, ttl, info, cin.ETag, from, first)
			l.Took = fromTook
			return l, nil
		}
		age := cin.Date.Sub(cin.Modified)
		took := TookReleased
		switch {
		case cur.Released:
		case age > cur.TTL():
			took = TookExpired
		case s.resumable(name, cur.ID):
			took = TookResumed
		default:
			return nil, &HeldError{Name: name, Holder: cur.Holder, Until: time.Now().Add(cur.TTL() - age)}
		}
		sent = time.Now()
		in, err = s.b.Put(ctx, key, body, PutOptions{IfMatch: cin.ETag})
		if err == nil {
			l := s.startLease(ctx, name, ttl, info, in.ETag, cur.Holder, sent)
			l.Took = took
			return l, nil
		}
		from, fromTook = cur.Holder, took
		if !errors.Is(err, ErrPrecondition) && !errors.Is(err, ErrNotFound) {
			if cur, cin, rerr := s.readLease(ctx, name); rerr == nil && cur.ID == info.ID {
				l := s.startLease(ctx, name, ttl, info, cin.ETag, from, first)
				l.Took = fromTook
				return l, nil
			}
			return nil, err
		}
		// Someone else took it over or it changed: look again. Bounded:
		// a lease that changes on every look is held by someone.
		if attempt >= 8 {
			return nil, &HeldError{Name: name, Holder: cur.Holder, Until: time.Now().Add(cur.TTL())}
		}
	}
}

// MinLeaseTTL is the shortest ttl a lease may have on this store: another
// machine may judge a lease up to one date grain older than it is, and its
// holder gives it up after 2/3 of its ttl, so the ttl spans at least
// MinLeaseTTLGrains grains (3s on S3); 10ms where dates are fine-grained.
func (s *Store) MinLeaseTTL() time.Duration {
	if g, ok := s.b.(DateGrain); ok {
		return max(MinLeaseTTLGrains*g.DateGrain(), 10*time.Millisecond)
	}
	return 10 * time.Millisecond
}

// maxLeaseBytes bounds a lease object read: its Blobs, a stage's outputs,
// are some thousands at most.
const maxLeaseBytes = 1 << 20

// readLease reads a lease object.
func (s *Store) readLease(ctx context.Context, name string) (LeaseInfo, Info, error) {
	body, in, err := s.b.Get(ctx, leaseKey(name), maxLeaseBytes)
	if err != nil {
		return LeaseInfo{}, Info{}, err
	}
	var li LeaseInfo
	if err := json.Unmarshal(body, &li); err != nil {
		// Unreadable: treat as expired at once (anyone may take it over).
		li = LeaseInfo{Holder: "(unreadable lease)", Released: true, Unreadable: true}
	}
	if in.Date.IsZero() {
		return LeaseInfo{}, Info{}, fmt.Errorf("%s: lease %s: the storage gave no Date: ages cannot be judged", s.b, name)
	}
	return li, in, nil
}

// LeaseStatus reads the lease name: who holds it and until when on this
// machine's clock; ErrNotFound when there is none. A released or expired
// lease is returned with ok false.
func (s *Store) LeaseStatus(ctx context.Context, name string) (li LeaseInfo, until time.Time, ok bool, err error) {
	if err := checkName("lease", name); err != nil {
		return LeaseInfo{}, time.Time{}, false, err
	}
	li, in, err := s.readLease(ctx, name)
	if err != nil {
		return LeaseInfo{}, time.Time{}, false, err
	}
	age := in.Date.Sub(in.Modified)
	return li, time.Now().Add(li.TTL() - age), !li.Released && age <= li.TTL(), nil
}

// WaitLease acquires the lease name, waiting while another holder has it:
// it looks again every poll (ttl/4 when 0), calling onWait with who holds
// it each time it finds it held.
func (s *Store) WaitLease(ctx context.Context, name string, ttl, poll time.Duration, onWait func(*HeldError)) (*Lease, error) {
	if poll <= 0 {
		poll = max(ttl/4, 10*time.Millisecond)
	}
	for {
		l, err := s.AcquireLease(ctx, name, ttl)
		var held *HeldError
		if !errors.As(err, &held) {
			return l, err
		}
		if onWait != nil {
			onWait(held)
		}
		select {
		case <-time.After(min(poll, max(time.Until(held.Until), 10*time.Millisecond))):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (s *Store) startLease(ctx context.Context, name string, ttl time.Duration, info LeaseInfo, etag, from string, sent time.Time) *Lease {
	lctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	l := &Lease{s: s, name: name, ttl: ttl, TakenFrom: from, ctx: lctx, cancel: cancel,
		stop: make(chan struct{}), done: make(chan struct{}), info: info, etag: etag}
	s.live.mu.Lock()
	s.live.m[name] = l
	s.live.mu.Unlock()
	if s.opt.ResumeLeases {
		// Best effort: without it a later process waits for the ttl.
		jp := s.leaseJournal(name)
		if err := os.MkdirAll(filepath.Dir(jp), 0o755); err == nil {
			fsutil.WriteFileAtomic(jp, []byte(info.ID), 0o644)
		}
	}
	go l.renew(ctx, sent)
	return l
}

// forget drops l from this process's live leases; with its journal when
// it is released or lost (a lease left to expire keeps it: a later
// process with this cache takes it over).
func (l *Lease) forget(journal bool) {
	s := l.s
	s.live.mu.Lock()
	if s.live.m[l.name] == l {
		delete(s.live.m, l.name)
	}
	s.live.mu.Unlock()
	if journal && s.opt.ResumeLeases {
		if b, err := os.ReadFile(s.leaseJournal(l.name)); err == nil && string(b) == l.info.ID {
			os.Remove(s.leaseJournal(l.name))
		}
	}
}

// Context is cancelled, with ErrLeaseLost as its cause, when the lease is
// lost; a stage runs under it.
func (l *Lease) Context() context.Context { return l.ctx }

// Err is nil while the lease is held or after Release, else why it was
// lost (errors.Is ErrLeaseLost) or stopped being renewed (the context
// it was acquired with ended).
func (l *Lease) Err() error {
	if l.released.Load() {
		return nil
	}
	if err := context.Cause(l.ctx); err != nil && !errors.Is(err, errReleased) {
		return err
	}
	return nil
}

// Name is the lease's name.
func (l *Lease) Name() string { return l.name }

var errReleased = errors.New("store: lease released")

// renew keeps the lease until Release (stop), the caller's ctx ends
// (the lease is left to expire), or the lease is lost.
//
// The lease holds until ttl after the storage wrote the last renewal it
// accepted, which it received after the renewal was sent. The holder gives
// it up earlier, 2/3 ttl after that send: another machine judges the age
// by the storage's clock, whose dates may have whole seconds only (S3), so
// it may see the lease up to a second older than it is.
func (l *Lease) renew(ctx context.Context, sent time.Time) {
	defer close(l.done)
	// A lost lease is no longer this process's; one stopped by Release
	// or its context stays so until Release.
	defer func() {
		if errors.Is(l.Err(), ErrLeaseLost) {
			l.forget(true)
		}
	}()
	every := l.ttl / 3
	keep := l.ttl * 2 / 3
	deadline := sent.Add(keep)
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-ctx.Done():
			l.cancel(fmt.Errorf("lease %s: %w", l.name, ctx.Err()))
			return
		case <-t.C:
		}
		if time.Now().After(deadline) {
			l.cancel(fmt.Errorf("%s: lease %s: not renewed within 2/3 of its ttl %v: %w", l.s.b, l.name, l.ttl, ErrLeaseLost))
			return
		}
		at := time.Now()
		rctx, cancel := context.WithDeadline(ctx, deadline)
		err := l.write(rctx, func(*LeaseInfo) {})
		cancel()
		switch {
		case err == nil:
			deadline = at.Add(keep)
			t.Reset(every)
		case errors.Is(err, ErrPrecondition) || errors.Is(err, ErrNotFound):
			l.cancel(fmt.Errorf("%s: lease %s: %s: %w", l.s.b, l.name, l.lostHow(ctx, err), ErrLeaseLost))
			return
		default:
			// A failed renewal is tried again soon, until the deadline.
			t.Reset(max(l.ttl/10, 5*time.Millisecond))
		}
	}
}

// lostHow says how the lease, which its holder could not write again
// (err), was lost: rewritten by another holder, or removed (gc removes an
// expired one; some storage answers a write conditional on a version of a
// key that is gone with a failed precondition, so it is looked for).
func (l *Lease) lostHow(ctx context.Context, err error) string {
	if !errors.Is(err, ErrNotFound) {
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, herr := l.s.b.Head(hctx, leaseKey(l.name)); !errors.Is(herr, ErrNotFound) {
			return "taken over by another holder"
		}
	}
	return "removed once it had expired (the holder did not renew it in time)"
}

// releaseTimeout bounds a Release's write.
const releaseTimeout = 15 * time.Second

// Release gives the lease up: the next AcquireLease takes it at once. It
// returns ErrLeaseLost if the lease was lost before. A lease whose
// context ended (Ctrl-C) is released too: the run that comes next, here
// or elsewhere, need not wait for its ttl.
func (l *Lease) Release(ctx context.Context) error {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
	if l.released.Load() {
		return nil
	}
	if err := l.Err(); errors.Is(err, ErrLeaseLost) {
		l.forget(true)
		return err
	}
	// Bounded: a storage that stopped answering must not hold up the
	// end of a run (or its Ctrl-C); the lease then expires after its ttl.
	ctx, cancel := context.WithTimeout(ctx, min(l.ttl, releaseTimeout))
	defer cancel()
	// Its marks go first, while it is held: whoever sees it released
	// finds no mark of it either.
	l.unmark(ctx)
	err := l.write(ctx, func(i *LeaseInfo) { i.Released = true })
	if errors.Is(err, ErrPrecondition) || errors.Is(err, ErrNotFound) {
		err = fmt.Errorf("%s: lease %s: taken over before release: %w", l.s.b, l.name, ErrLeaseLost)
		l.cancel(err)
		l.forget(true)
		return err
	}
	if err != nil {
		// Not renewed any more: it expires after its ttl.
		l.cancel(fmt.Errorf("%s: lease %s: release: %w", l.s.b, l.name, err))
		return err
	}
	l.released.Store(true)
	l.cancel(errReleased)
	l.forget(true)
	return nil
}
