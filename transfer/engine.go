package transfer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/journal"
	"github.com/ferry-llm/ferry/internal/progress"
)

// Dialer opens one SSH connection to a destination's host. Run calls it
// once per stream, and again after a connection drops.
type Dialer func(ctx context.Context) (*ssh.Client, error)

// Destination is one remote directory.
type Destination struct {
	Name string // as the user wrote it, "[user@]host:dir": reports and errors name it
	Host string // the host part
	// Dir is the remote directory. A relative path (or "~/…") is relative
	// to the login directory, as scp and sftp take it.
	Dir  string
	Dial Dialer
}

// Options tune Run.
type Options struct {
	// Streams is the number of SSH connections per destination (default
	// 4), each carrying SessionsPerConn SFTP sessions that write chunks at
	// their offsets. One SSH channel moves at most its 2 MiB window per
	// round trip, so on a 40 ms link more channels and connections, not
	// bigger packets, are what makes a copy fast.
	Streams int
	// Sessions is the number of SFTP sessions (SSH channels) on each
	// stream's connection (default SessionsPerConn). Each moves at most
	// its window per round trip and idles while the last writes of a
	// chunk and its fsync are acknowledged; more of them keep more bytes
	// in flight, at the cost of one chunk buffer each.
	Sessions int
	// StateDir holds the resume journals, one per destination (required).
	StateDir string
	// MaxPacket is the SFTP write size; 0 picks the largest the server
	// allows (255 KiB where it advertises limits@openssh.com, as every
	// OpenSSH since 8.7 does; else the 32 KiB every server must take).
	MaxPacket int
	// Verify re-hashes remote files that an earlier run verified and
	// journaled, instead of trusting their size.
	Verify bool
	// Retries bounds the retries of one operation after transient errors
	// (a dropped connection, a stall): default 8, with a backoff from
	// Backoff (default 200 ms) doubling up to 5 s.
	Retries int
	Backoff time.Duration
	// StallTimeout: a connection that makes no progress for this long is
	// closed and the operation retried (default 60 s).
	StallTimeout time.Duration
	// DialTimeout bounds one connection attempt (default 30 s).
	DialTimeout time.Duration
	// Progress, if not nil, makes the reporter of one destination.
	Progress func(dest string, total int64) progress.Reporter
	// PreFlight, if not nil, runs before anything is sent to a destination
	// (route and interface checks); its error fails that destination.
	PreFlight func(ctx context.Context, d Destination) error
	Log       *slog.Logger
}

func (o *Options) defaults() {
	if o.Streams < 1 {
		o.Streams = 4
	}
	if o.Sessions < 1 {
		o.Sessions = SessionsPerConn
	}
	if o.Retries == 0 {
		o.Retries = 8
	}
	if o.Backoff <= 0 {
		o.Backoff = 200 * time.Millisecond
	}
	if o.StallTimeout <= 0 {
		o.StallTimeout = 60 * time.Second
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 30 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
}

// openSSHMaxData is the largest read or write OpenSSH's sftp-server takes
// (SFTP_MAX_READ_LENGTH, 256 KiB less 1024 for the header; sftp-server.c).
const openSSHMaxData = 256*1024 - 1024

// errStalled marks an operation whose connection was closed for making no
// progress.
var errStalled = errkind.New(errkind.Retryable, "connection stalled")

// ErrRemoteFull is wrapped by errors about a remote file system without
// room for a file.
var ErrRemoteFull = errors.New("remote file system full")

// ErrRemoteHash is wrapped when the remote hash tool reports a digest that
// the file's bytes, read back, contradict.
var ErrRemoteHash = errkind.New(errkind.VerifyFailed, "the remote hash command reports a wrong digest")

// ErrVerify is wrapped when a remote file keeps differing from the source
// after its bad chunks were sent again.
var ErrVerify = errkind.New(errkind.VerifyFailed, "remote file does not match")

// isTransient reports errors that a new connection may cure.
func isTransient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	// An error that knows its kind decides (a host key or login refused
	// is never retried, whatever it wraps).
	var k errkind.Kinded
	if errors.As(err, &k) {
		return k.Kind() == errkind.Retryable
	}
	for _, e := range []error{sftp.ErrSSHFxConnectionLost, io.EOF, io.ErrUnexpectedEOF, net.ErrClosed,
		syscall.ECONNRESET, syscall.EPIPE, syscall.ECONNREFUSED, syscall.ETIMEDOUT, os.ErrDeadlineExceeded, context.DeadlineExceeded} {
		if errors.Is(err, e) {
			return true
		}
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	s := err.Error()
	return strings.Contains(s, "connection lost") || strings.Contains(s, "use of closed network connection") ||
		strings.Contains(s, "connection reset")
}

// deadOr marks err retryable when the connection it happened on is gone
// (or goes within a moment: the error can arrive first): whatever the
// error says, a new connection may cure it.
func deadOr(dead <-chan struct{}, err error) error {
	if isTransient(err) {
		return err
	}
	select {
	case <-dead:
	case <-time.After(100 * time.Millisecond):
		return err
	}
	return errkind.Mark(errkind.Retryable, fmt.Errorf("connection lost: %w", err))
}

// conn is one stream: an SSH connection and its SFTP session.
type conn struct {
	ssh     *ssh.Client
	sftp    *sftp.Client
	busy    atomic.Int32
	last    atomic.Int64 // unix ns of the last progress
	stalled atomic.Bool
	dead    chan struct{}         // closed when the SSH connection is gone
	files   map[string]*sftp.File // open partials, by remote path
}

func (c *conn) touch() { c.last.Store(time.Now().UnixNano()) }

func (c *conn) close() {
	for _, f := range c.files {
		f.Close()
	}
	c.files = nil
	if c.sftp != nil {
		c.sftp.Close()
	}
	c.ssh.Close()
}

// open returns the slot's handle on the remote file p, opened for writing.
func (c *conn) open(p string) (*sftp.File, error) {
	if f := c.files[p]; f != nil {
		return f, nil
	}
	f, err := c.sftp.OpenFile(p, os.O_WRONLY)
	if err != nil {
		return nil, err
	}
	if c.files == nil {
		c.files = map[string]*sftp.File{}
	}
	c.files[p] = f
	return f, nil
}

func (c *conn) closeFile(p string) {
	if f := c.files[p]; f != nil {
		f.Close()
		delete(c.files, p)
	}
}

// progressReader counts what pkg/sftp reads for sending: the stream is
// alive, and the destination's bar moves.
type progressReader struct {
	r    io.Reader
	c    *conn
	prog progress.Reporter
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.c.touch()
		if p.prog != nil {
			p.prog.Add(int64(n))
		}
	}
	return n, err
}

// fileState is what the journal says about one file at one destination.
type fileState struct {
	partial int64 // size the partial was created with; -1: none
	chunks  map[int]digest.Digest
	done    digest.Digest // verified and renamed into place
}

// host is one destination during a run.
type host struct {
	d      Destination
	dir    string // remote directory as SFTP and the shell take it
	p      *Plan
	o      *Options
	slots  []*conn    // SFTP sessions: Streams × Sessions
	conns  []*sshConn // SSH connections: Streams
	packet int        // SFTP packet size, decided on the first connection

	hashCmd string
	ranges  bool // dd cuts chunks for hashCmd: files are verified chunk by chunk
	posix   bool // posix-rename@openssh.com
	fsync   bool // fsync@openssh.com
	statvfs bool // statvfs@openssh.com

	jmu   sync.Mutex
	jl    *journal.Log
	state map[string]*fileState

	mu     sync.Mutex
	failed *HostError

	rep   HostReport
	fr    map[string]*FileReport
	prog  progress.Reporter
	sent  atomic.Int64
	start time.Time

	// per file, during the send phase
	need     []bool
	verified map[int]bool // chunks the remote host hashed right after this run wrote them
	files    int          // files verified
}

func newHost(d Destination, p *Plan, o *Options) *host {
	dir := d.Dir
	switch {
	case dir == "~" || dir == "":
		dir = "."
	case strings.HasPrefix(dir, "~/"):
		dir = strings.TrimPrefix(dir, "~/")
	}
	h := &host{d: d, dir: path.Clean(dir), p: p, o: o, slots: make([]*conn, o.Streams*o.Sessions), state: map[string]*fileState{},
		fr: map[string]*FileReport{}, conns: make([]*sshConn, o.Streams)}
	for i := range h.conns {
		h.conns[i] = &sshConn{}
	}
	h.rep = HostReport{Destination: d.Name, Host: d.Host, Dir: d.Dir}
	return h
}

func (h *host) remote(rel string) string { return path.Join(h.dir, rel) }

func (h *host) err() *HostError {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failed
}

// fail records the destination's first failure.
func (h *host) fail(file string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failed != nil {
		return
	}
	h.failed = &HostError{Dest: h.d.Name, File: file, Err: err}
	if fr := h.fr[file]; fr != nil {
		fr.Error = err.Error()
	}
	h.o.Log.Warn("transfer failed", "dest", h.d.Name, "file", file, "err", err)
}

// SessionsPerConn is the default number of SFTP sessions (SSH channels)
// each stream's connection carries, each writing chunks of its own: a channel
// moves at most its 2 MiB window per round trip, and the channels of one
// connection share its TCP window and one cipher stream. Several per
// connection keep a stream's pipe full across the round trip that ends
// each chunk (its last acknowledgements and fsync). Four, not two: on a
// 16-core host, a 2 GB file through 40 ms of round trip went at 226 MB/s
// with four (4.8× scp's 47 MB/s) and at 170 MB/s with two, and on plain
// loopback at 407 and 416 MB/s (BenchmarkTransfer); each costs one chunk
// buffer.
const SessionsPerConn = 4

// MaxStreams and MaxSessions bound Options.Streams and Options.Sessions
// where users choose them (ferry transfer's flags, the transfer stage).
const (
	MaxStreams  = 64
	MaxSessions = 16
)

// sshConn is one stream's SSH connection, shared by its sessions.
type sshConn struct {
	mu   sync.Mutex // held while dialing
	ssh  *ssh.Client
	dead chan struct{} // closed when the connection is gone
}

// connect returns slot i's session, dialing its stream's connection if
// that is not up.
func (h *host) connect(ctx context.Context, i int) (*conn, error) {
	if c := h.live(i); c != nil {
		return c, nil
	}
	g := h.conns[i/h.o.Sessions]
	g.mu.Lock()
	defer g.mu.Unlock()
	// Another goroutine of this slot (a stream and the chunk checks share
	// one) may have connected it while this one waited.
	if c := h.live(i); c != nil {
		return c, nil
	}
	if g.ssh != nil && isClosed(g.dead) {
		g.ssh = nil
	}
	if g.ssh == nil {
		dctx, cancel := context.WithTimeout(ctx, h.o.DialTimeout)
		sc, err := h.d.Dial(dctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		}
		dead := make(chan struct{})
		go func() { sc.Wait(); close(dead) }()
		g.ssh, g.dead = sc, dead
	}
	sc, dead := g.ssh, g.dead
	opts := []sftp.ClientOption{sftp.UseConcurrentWrites(true), sftp.UseConcurrentReads(true)}
	if h.packet > 0 {
		opts = append(opts, sftp.MaxPacketUnchecked(h.packet))
	}
	fc, err := sftp.NewClient(sc, opts...)
	if err != nil {
		sc.Close()
		return nil, deadOr(dead, fmt.Errorf("starting SFTP: %w", err))
	}
	if h.packet == 0 {
		h.packet = 32 * 1024
		if h.o.MaxPacket > 0 {
			h.packet = h.o.MaxPacket
		} else if _, ok := fc.HasExtension("limits@openssh.com"); ok {
			h.packet = openSSHMaxData
		}
		_, h.posix = fc.HasExtension("posix-rename@openssh.com")
		v, ok := fc.HasExtension("fsync@openssh.com")
		h.fsync = ok && v == "1"
		_, h.statvfs = fc.HasExtension("statvfs@openssh.com")
		fc.Close()
		if fc, err = sftp.NewClient(sc, append(opts, sftp.MaxPacketUnchecked(h.packet))...); err != nil {
			sc.Close()
			return nil, deadOr(dead, fmt.Errorf("starting SFTP: %w", err))
		}
	}
	c := &conn{ssh: sc, sftp: fc, dead: dead}
	c.touch()
	h.mu.Lock()
	h.slots[i] = c
	h.mu.Unlock()
	return c, nil
}

// live is slot i's session if its connection is up; one whose connection
// is gone is dropped.
func (h *host) live(i int) *conn {
	h.mu.Lock()
	c := h.slots[i]
	if c != nil && isClosed(c.dead) {
		h.slots[i] = nil
		h.mu.Unlock()
		c.close()
		return nil
	}
	h.mu.Unlock()
	return c
}

func (h *host) slot(i int) *conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.slots[i]
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// drop closes slot i's connection (after an error on it).
func (h *host) drop(i int) {
	h.mu.Lock()
	c := h.slots[i]
	h.slots[i] = nil
	h.mu.Unlock()
	if c != nil {
		c.close()
	}
}

// do runs f on slot i's connection, reconnecting and retrying after
// transient errors, with a bounded backoff.
func (h *host) do(ctx context.Context, i int, what string, f func(c *conn) error) error {
	t0 := time.Now()
	defer func() { h.o.Log.Debug("transfer: op", "dest", h.d.Name, "what", what, "took", time.Since(t0)) }()
	for attempt := 0; ; attempt++ {
		c, err := h.connect(ctx, i)
		if err == nil {
			c.busy.Add(1)
			c.touch()
			err = f(c)
			c.busy.Add(-1)
			if err != nil && c.stalled.Load() {
				err = fmt.Errorf("%w: no progress for %v (%v)", errStalled, h.o.StallTimeout, err)
			} else if err != nil {
				err = deadOr(c.dead, err)
			}
		}
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !isTransient(err) || attempt >= h.o.Retries {
			if isTransient(err) {
				err = errkind.Errorf(errkind.Failure, "%w (gave up after %d retries)", err, attempt)
			}
			return err
		}
		h.drop(i)
		wait := min(h.o.Backoff<<attempt, 5*time.Second)
		wait = wait/2 + rand.N(wait/2+1)
		h.o.Log.Info("transfer: retrying", "dest", h.d.Name, "what", what, "attempt", attempt+1, "in", wait.Round(time.Millisecond), "err", err)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// watch closes connections that make no progress for StallTimeout while
// an operation runs on them, and every connection when ctx ends (pkg/sftp
// calls take no context).
func (h *host) watch(ctx context.Context, stop <-chan struct{}) {
	t := time.NewTicker(max(h.o.StallTimeout/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			h.mu.Lock()
			for _, c := range h.slots {
				if c != nil {
					c.ssh.Close()
				}
			}
			h.mu.Unlock()
			return
		case <-t.C:
			now := time.Now().UnixNano()
			for _, c := range h.slotsSnapshot() {
				if c != nil && c.busy.Load() > 0 && now-c.last.Load() > int64(h.o.StallTimeout) {
					c.stalled.Store(true)
					c.ssh.Close()
				}
			}
		}
	}
}

func (h *host) slotsSnapshot() []*conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*conn(nil), h.slots...)
}

// begin connects, checks the remote directory and creates the plan's
// directories, finds the hash command and opens the journal.
func (h *host) begin(ctx context.Context) error {
	if h.o.PreFlight != nil {
		if err := h.o.PreFlight(ctx, h.d); err != nil {
			return err
		}
	}
	err := h.do(ctx, 0, "prepare "+h.dir, func(c *conn) error {
		if err := h.mkdir(c, h.dir, true); err != nil {
			return err
		}
		for _, d := range h.p.Dirs {
			if err := h.mkdir(c, h.remote(d), false); err != nil {
				return err
			}
		}
		cmd, err := detectHash(ctx, c.ssh)
		if err != nil {
			return err
		}
		h.hashCmd = cmd
		if cmd != "" {
			if h.ranges, err = detectRange(ctx, c.ssh, cmd); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	h.rep.HashCommand = h.hashCmd
	if h.ranges {
		h.rep.HashCommand = "dd | " + h.hashCmd
	}
	if h.hashCmd == "" {
		h.rep.HashCommand = ReadBack
		h.o.Log.Info("transfer: no sha256 tool on the remote host; verifying by reading files back", "dest", h.d.Name)
	}
	return h.openJournal()
}

// mkdir makes the remote directory p (all of its parents when all),
// refusing a path that exists as something else.
func (h *host) mkdir(c *conn, p string, all bool) error {
	fi, err := c.sftp.Stat(p)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		return errkind.Errorf(errkind.BadInput, "remote path %s exists and is not a directory", p)
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("remote %s: %w", p, err)
	case all:
		if err := c.sftp.MkdirAll(p); err != nil {
			return fmt.Errorf("creating remote directory %s: %w", p, err)
		}
	default:
		if err := c.sftp.Mkdir(p); err != nil {
			return fmt.Errorf("creating remote directory %s: %w", p, err)
		}
	}
	return nil
}

// prepare decides what file f needs at this destination: nothing (it is
// there with its digest), the chunks a journaled partial lacks, or all of
// them in a new partial.
func (h *host) prepare(ctx context.Context, f *File) (skip bool, err error) {
	st := h.stateOf(f.Rel)
	fr := &FileReport{Path: f.Rel, Size: f.Size, Digest: f.Digest}
	h.mu.Lock()
	h.fr[f.Rel] = fr
	h.mu.Unlock()
	n := f.Chunks(h.p.ChunkSize)
	h.need = make([]bool, n)
	remote := h.remote(f.Rel)
	part := remote + ".partial"
	err = h.do(ctx, 0, "stat "+remote, func(c *conn) error {
		fi, err := c.sftp.Lstat(remote)
		switch {
		case err == nil && fi.IsDir():
			return errkind.Errorf(errkind.BadInput, "remote path %s is a directory", remote)
		case err == nil && fi.Mode().IsRegular() && fi.Size() == f.Size:
			if st.done == f.Digest && !h.o.Verify {
				skip = true
				return nil
			}
			d, _, err := h.hash(ctx, c, remote, f.Size)
			if err != nil {
				return err
			}
			if d == f.Digest {
				skip = true
				return nil
			}
			h.o.Log.Info("transfer: remote file differs; replacing it", "dest", h.d.Name, "file", f.Rel, "remote", d, "want", f.Digest)
		case err != nil && !errors.Is(err, os.ErrNotExist):
			return fmt.Errorf("remote %s: %w", remote, err)
		}
		if st.partial == f.Size {
			if pfi, err := c.sftp.Lstat(part); err == nil && pfi.Mode().IsRegular() && pfi.Size() == f.Size {
				fr.Resumed = len(st.chunks) > 0
				return h.roomFor(c, f, st)
			}
		}
		st.chunks = map[int]digest.Digest{}
		st.partial = -1
		if err := h.roomFor(c, f, st); err != nil {
			return err
		}
		// Journaled before the partial is touched: its line drops the
		// chunk lines of any earlier partial, so a kill from here on
		// leaves no chunk line that the new (zeroed) partial contradicts.
		if err := h.journal(jEntry{kind: jPartial, rel: f.Rel, size: f.Size}); err != nil {
			return err
		}
		pf, err := c.sftp.OpenFile(part, os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
		if err != nil {
			return fmt.Errorf("creating %s: %w", part, err)
		}
		err = pf.Truncate(f.Size)
		if err == nil && h.fsync {
			err = pf.Sync()
		}
		if cerr := pf.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("creating %s: %w", part, err)
		}
		if hookPartialCreated != nil {
			if err := hookPartialCreated(f.Rel); err != nil {
				return err
			}
		}
		st.partial = f.Size
		return nil
	})
	if err != nil {
		return false, err
	}
	if skip {
		fr.Verified, fr.Skipped = true, true
		h.rep.Bytes += f.Size
		if st.done == f.Digest {
			return true, nil
		}
		st.done = f.Digest
		return true, h.journal(jEntry{kind: jDone, rel: f.Rel, digest: f.Digest})
	}
	for i := range h.need {
		_, ok := st.chunks[i]
		h.need[i] = !ok
	}
	return false, nil
}

// hookPartialCreated, set only by tests, runs right after prepare has
// created a partial: an error from it ends the run there, as a kill at
// that point would.
var hookPartialCreated func(rel string) error

// roomFor refuses a file the remote file system has no room for, before a
// byte is sent (statvfs@openssh.com; servers without it are not asked).
func (h *host) roomFor(c *conn, f *File, st *fileState) error {
	if !h.statvfs {
		return nil
	}
	vfs, err := c.sftp.StatVFS(h.dir)
	if err != nil {
		return nil // the write will say
	}
	needed := f.Size - int64(len(st.chunks))*h.p.ChunkSize
	free := int64(vfs.Favail) * int64(vfs.Frsize)
	if vfs.Bavail > 0 || vfs.Frsize > 0 {
		free = int64(vfs.Bavail) * int64(vfs.Frsize)
	}
	if needed > 0 && free < needed {
		return fmt.Errorf("%w: %s needs %d more bytes, %s has %d free", ErrRemoteFull, f.Rel, needed, h.dir, free)
	}
	return nil
}

// explain adds what a remote write failure probably means: a full disk
// reports only SSH_FX_FAILURE.
func (h *host) explain(c *conn, err error) error {
	var se *sftp.StatusError
	if !errors.As(err, &se) || !h.statvfs {
		return err
	}
	if vfs, verr := c.sftp.StatVFS(h.dir); verr == nil && vfs.Bavail*vfs.Frsize < 1<<20 {
		return fmt.Errorf("%w (%d bytes free): %v", ErrRemoteFull, vfs.Bavail*vfs.Frsize, err)
	}
	return err
}

// writeChunk writes data at off into the partial of f from slot i, and
// makes it durable (fsync@openssh.com) before it returns.
func (h *host) writeChunk(ctx context.Context, i int, f *File, off int64, data []byte) error {
	part := h.remote(f.Rel) + ".partial"
	return h.do(ctx, i, fmt.Sprintf("write %s at %d", part, off), func(c *conn) error {
		pf, err := c.open(part)
		if err != nil {
			return fmt.Errorf("opening %s: %w", part, err)
		}
		if _, err := pf.Seek(off, io.SeekStart); err != nil {
			return err
		}
		n, err := pf.ReadFromWithConcurrency(&progressReader{r: bytes.NewReader(data), c: c, prog: h.prog}, 0)
		if err == nil && n != int64(len(data)) {
			err = fmt.Errorf("wrote %d of %d bytes", n, len(data))
		}
		if err == nil && h.fsync {
			err = pf.Sync()
		}
		if err != nil {
			return h.explain(c, fmt.Errorf("writing %s at offset %d: %w", part, off, err))
		}
		return nil
	})
}

// hash is the sha256 of the remote file p: by the remote tool, or by
// reading it back (which also gives the chunk digests).
func (h *host) hash(ctx context.Context, c *conn, p string, size int64) (digest.Digest, []digest.Digest, error) {
	if h.hashCmd != "" {
		var d digest.Digest
		err := h.remoteTool(ctx, c, size, func(ctx context.Context) (err error) {
			d, err = remoteHash(ctx, c.ssh, h.hashCmd, p)
			return err
		})
		return d, nil, err
	}
	return h.readBack(ctx, c, p, size)
}

// remoteTool runs f, a remote command hashing n bytes, on c. The
// connection carries nothing while the tool reads, so the stall watch
// leaves it alone; instead the command has a time bound of its own (the
// stall timeout, at least 2 s, plus n at 10 MB/s): a connection that died
// under it (its bytes dropped on a stalled link) is then given up and the
// operation retried on a new one, instead of waiting for an answer that
// cannot come.
func (h *host) remoteTool(ctx context.Context, c *conn, n int64, f func(ctx context.Context) error) error {
	limit := max(h.o.StallTimeout, 2*time.Second) + time.Duration(n/10e6)*time.Second
	tctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	c.busy.Add(-1)
	err := f(tctx)
	c.busy.Add(1)
	c.touch()
	if err != nil && ctx.Err() == nil && tctx.Err() != nil {
		err = fmt.Errorf("%w: the remote hash command gave no answer in %v", errStalled, limit)
	}
	return err
}

// readBack reads the remote file p over SFTP and returns its digest and
// the digests of its chunks.
func (h *host) readBack(ctx context.Context, c *conn, p string, size int64) (digest.Digest, []digest.Digest, error) {
	rf, err := c.sftp.Open(p)
	if err != nil {
		return "", nil, fmt.Errorf("reading back %s: %w", p, err)
	}
	defer rf.Close()
	whole := sha256.New()
	var chunks []digest.Digest
	buf := make([]byte, min(h.p.ChunkSize, max(size, 1)))
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return "", nil, err
		}
		b := buf[:min(int64(len(buf)), size-off)]
		n, err := rf.ReadAt(b, off)
		if n < len(b) {
			if err == nil || err == io.EOF {
				return "", nil, fmt.Errorf("reading back %s: %d bytes, want %d", p, off+int64(n), size)
			}
			return "", nil, fmt.Errorf("reading back %s at offset %d: %w", p, off, err)
		}
		c.touch()
		whole.Write(b)
		s := sha256.Sum256(b)
		chunks = append(chunks, digest.New(s[:]))
		off += int64(n)
	}
	return digest.New(whole.Sum(nil)), chunks, nil
}

// finish verifies f's partial at this destination, re-sends the chunks
// that differ, and renames it into place. sums are the digests of f's
// chunks as this run read them (sendFile, which also checked that they
// make up f.Digest): where the remote host can hash chunks, each chunk is
// checked against them, in parallel; elsewhere the whole file is hashed
// there, or read back.
func (h *host) finish(ctx context.Context, f *File, sums []digest.Digest) error {
	st := h.stateOf(f.Rel)
	fr := h.fr[f.Rel]
	remote := h.remote(f.Rel)
	part := remote + ".partial"
	for _, c := range h.slots {
		if c != nil {
			c.closeFile(part)
		}
	}
	n := f.Chunks(h.p.ChunkSize)
	if h.ranges && len(sums) == n {
		return h.finishByChunks(ctx, f, sums)
	}
	return h.do(ctx, 0, "verify "+part, func(c *conn) error {
		for round := 0; ; round++ {
			d, chunks, err := h.hash(ctx, c, part, f.Size)
			if err != nil {
				return fmt.Errorf("verifying %s: %w", part, err)
			}
			if d == f.Digest {
				break
			}
			toolSaid := d
			if chunks == nil {
				if d, chunks, err = h.readBack(ctx, c, part, f.Size); err != nil {
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
					ErrRemoteHash, h.hashCmd, part, toolSaid.Short(), f.Digest.Short())
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
				if err := h.resend(ctx, c, f, i, st.chunks[i]); err != nil {
					return err
				}
				fr.Repaired++
			}
		}
		return h.commit(c, f, part, remote)
	})
}

// forget drops what the journal holds of rel's partial, whose chunks are
// not of the file planned.
func (h *host) forget(rel string) {
	st := h.stateOf(rel)
	h.jmu.Lock()
	st.chunks = map[int]digest.Digest{}
	st.partial = -1
	h.jmu.Unlock()
	h.journal(jEntry{kind: jPartial, rel: rel, size: -1})
}

// commit gives the verified partial f's mode and renames it into place.
func (h *host) commit(c *conn, f *File, part, remote string) error {
	if err := c.sftp.Chmod(part, f.Perm); err != nil {
		return fmt.Errorf("chmod %s: %w", part, err)
	}
	return h.rename(c, part, remote)
}

// finishByChunks is finish where the remote host hashes chunks: every
// chunk of the partial is hashed there, many at once, and compared with
// sums; the chunks that differ are read back over SFTP (a tool that
// misreports is an error, not a reason to send again) and re-sent, at
// most twice, before the partial is renamed into place.
func (h *host) finishByChunks(ctx context.Context, f *File, sums []digest.Digest) error {
	fr := h.fr[f.Rel]
	remote := h.remote(f.Rel)
	part := remote + ".partial"
	var todo []int
	for i := range sums {
		if !h.verified[i] {
			todo = append(todo, i)
		}
	}
	h.o.Log.Debug("transfer: chunks to check after the last byte", "dest", h.d.Name, "file", f.Rel, "chunks", len(todo), "of", len(sums))
	for round := 0; ; round++ {
		bad, err := h.checkChunks(ctx, part, todo, sums)
		if err != nil {
			return fmt.Errorf("verifying %s: %w", part, err)
		}
		if len(bad) == 0 {
			break
		}
		if round >= 2 {
			return fmt.Errorf("%w: %s still differs in %d chunks after re-sending them twice", ErrVerify, part, len(bad))
		}
		err = h.do(ctx, 0, "repair "+part, func(c *conn) error {
			var wrong []int
			for _, i := range bad {
				d, err := h.readBackChunk(c, part, f, i)
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
				if err := h.resend(ctx, c, f, i, sums[i]); err != nil {
					return err
				}
				fr.Repaired++
			}
			todo = wrong
			return nil
		})
		if err != nil {
			return err
		}
	}
	return h.do(ctx, 0, "rename "+part, func(c *conn) error { return h.commit(c, f, part, remote) })
}

// checkChunks hashes chunks idx of the remote file part on the remote
// host, several at once on every stream's connection, and returns those
// whose digest is not sums[i], in order.
func (h *host) checkChunks(ctx context.Context, part string, idx []int, sums []digest.Digest) ([]int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Each exec is one more session on its connection beside the stream's
	// SFTP sessions (OpenSSH allows 10 by default).
	perConn := max(1, min(4, 10-h.o.Sessions))
	workers := min(len(idx), h.o.Streams*perConn)
	next := make(chan int)
	bad := make([]bool, len(sums))
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for g := range workers {
		slot := (g%h.o.Streams)*h.o.Sessions + (g/h.o.Streams)%h.o.Sessions
		wg.Go(func() {
			for i := range next {
				d, err := h.rangeHash(ctx, slot, part, i)
				if err != nil {
					errs <- err
					cancel()
					for range next {
					}
					return
				}
				bad[i] = d != sums[i]
			}
		})
	}
	for _, i := range idx {
		select {
		case next <- i:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		return nil, err
	default:
	}
	if err := ctx.Err(); err != nil {
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

// rangeHash hashes chunk i of the remote file part on the remote host,
// over slot's connection, retrying after transient errors (the check
// after the last byte).
func (h *host) rangeHash(ctx context.Context, slot int, part string, i int) (digest.Digest, error) {
	var d digest.Digest
	err := h.do(ctx, slot, fmt.Sprintf("hash chunk %d of %s", i, part), func(c *conn) (err error) {
		d, err = h.rangeHashOn(ctx, c, part, i)
		return err
	})
	return d, err
}

// rangeHashOn hashes chunk i of the remote file part on c's connection.
func (h *host) rangeHashOn(ctx context.Context, c *conn, part string, i int) (d digest.Digest, err error) {
	err = h.remoteTool(ctx, c, h.p.ChunkSize, func(ctx context.Context) (err error) {
		d, err = remoteRangeHash(ctx, c.ssh, h.hashCmd, part, h.p.ChunkSize, i)
		return err
	})
	return d, err
}

// readBackChunk reads chunk i of the remote file part over SFTP and
// returns its sha256.
func (h *host) readBackChunk(c *conn, part string, f *File, i int) (digest.Digest, error) {
	rf, err := c.sftp.Open(part)
	if err != nil {
		return "", fmt.Errorf("reading back %s: %w", part, err)
	}
	defer rf.Close()
	off := int64(i) * h.p.ChunkSize
	b := make([]byte, min(h.p.ChunkSize, f.Size-off))
	if n, err := rf.ReadAt(b, off); n < len(b) {
		return "", fmt.Errorf("reading back %s at offset %d: %d of %d bytes: %v", part, off, n, len(b), err)
	}
	c.touch()
	s := sha256.Sum256(b)
	return digest.New(s[:]), nil
}

// resend reads chunk i of f again and writes it over the connection c
// (the one finish verifies on). want is the chunk's digest as sent or
// read before ("": unknown): other bytes now mean the source changed.
func (h *host) resend(ctx context.Context, c *conn, f *File, i int, want digest.Digest) error {
	st := h.stateOf(f.Rel)
	off := int64(i) * h.p.ChunkSize
	data := make([]byte, min(h.p.ChunkSize, f.Size-off))
	if err := readChunk(f, off, data); err != nil {
		return err
	}
	s := sha256.Sum256(data)
	sum := digest.New(s[:])
	if want != "" && want != sum {
		return fmt.Errorf("%s: %w: chunk %d at offset %d", f.Path, ErrSourceChanged, i, off)
	}
	part := h.remote(f.Rel) + ".partial"
	pf, err := c.sftp.OpenFile(part, os.O_WRONLY)
	if err != nil {
		return err
	}
	defer pf.Close()
	if _, err := pf.WriteAt(data, off); err != nil {
		return h.explain(c, fmt.Errorf("writing %s at offset %d: %w", part, off, err))
	}
	if h.fsync {
		if err := pf.Sync(); err != nil {
			return err
		}
	}
	h.sent.Add(int64(len(data)))
	h.fr[f.Rel].Sent += int64(len(data))
	st.chunks[i] = sum
	return h.journal(jEntry{kind: jChunk, rel: f.Rel, chunk: i, end: off + int64(len(data)), digest: sum})
}

// rename moves the verified partial into place, replacing what is there.
func (h *host) rename(c *conn, part, remote string) error {
	var err error
	if h.posix {
		err = c.sftp.PosixRename(part, remote)
	} else {
		if rerr := c.sftp.Remove(remote); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			return fmt.Errorf("replacing %s: %w", remote, rerr)
		}
		err = c.sftp.Rename(part, remote)
	}
	if err != nil {
		return fmt.Errorf("renaming %s to %s: %w", part, remote, err)
	}
	return nil
}

// links makes the plan's symlinks.
func (h *host) links(ctx context.Context) error {
	for _, l := range h.p.Links {
		remote := h.remote(l.Rel)
		err := h.do(ctx, 0, "link "+remote, func(c *conn) error {
			fi, err := c.sftp.Lstat(remote)
			switch {
			case err == nil && fi.Mode()&os.ModeSymlink != 0:
				if t, err := c.sftp.ReadLink(remote); err == nil && t == l.Target {
					return nil
				}
				if err := c.sftp.Remove(remote); err != nil {
					return err
				}
			case err == nil && fi.IsDir():
				return errkind.Errorf(errkind.BadInput, "remote path %s is a directory, the source has a link there", remote)
			case err == nil:
				if err := c.sftp.Remove(remote); err != nil {
					return err
				}
			case !errors.Is(err, os.ErrNotExist):
				return err
			}
			if err := c.sftp.Symlink(l.Target, remote); err != nil {
				return fmt.Errorf("making link %s -> %s: %w", remote, l.Target, err)
			}
			return nil
		})
		if err != nil {
			h.fail(l.Rel, err)
			return err
		}
		h.rep.Links = append(h.rep.Links, l.Rel)
	}
	return nil
}

func readChunk(f *File, off int64, data []byte) error {
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

// job is one chunk read once and written to every destination that lacks
// it.
type job struct {
	idx  int
	off  int64
	data []byte
	sums []digest.Digest // the file's chunk digests; digest sets this one's
	once sync.Once
	refs atomic.Int32
	pool chan []byte
}

// digest is the chunk's sha256, computed by the first goroutine that asks
// (a stream after writing it, with fan-out the first of them).
func (j *job) digest() digest.Digest {
	j.once.Do(func() {
		s := sha256.Sum256(j.data)
		j.sums[j.idx] = digest.New(s[:])
	})
	return j.sums[j.idx]
}

func (j *job) release() {
	if j.refs.Add(-1) == 0 {
		j.pool <- j.data[:cap(j.data)]
	}
}

// Run sends the plan to every destination. Each destination is verified
// on its own and one failing does not stop the others: the report says
// what each holds, and the error (a *FailedError) which failed.
func Run(ctx context.Context, p *Plan, dests []Destination, o Options) (*Report, error) {
	o.defaults()
	if o.StateDir == "" {
		return nil, errors.New("transfer: no state directory for the journals")
	}
	if err := os.MkdirAll(o.StateDir, 0o755); err != nil {
		return nil, err
	}
	rep := &Report{Files: len(p.Files), Bytes: p.Bytes()}
	hosts := make([]*host, len(dests))
	for i, d := range dests {
		hosts[i] = newHost(d, p, &o)
	}
	stop := make(chan struct{})
	for _, h := range hosts {
		h.start = time.Now()
		if o.Progress != nil {
			h.prog = o.Progress(h.d.Name, p.Bytes())
		}
		go h.watch(ctx, stop)
	}
	each(hosts, func(h *host) {
		if err := h.begin(ctx); err != nil {
			h.fail("", err)
		}
	})
	for i := range p.Files {
		f := &p.Files[i]
		if ctx.Err() != nil {
			break
		}
		var send, fin []*host
		var smu sync.Mutex
		each(live(hosts), func(h *host) {
			t := time.Now()
			skip, err := h.prepare(ctx, f)
			h.fr[f.Rel].Seconds += time.Since(t).Seconds()
			switch {
			case err != nil:
				h.fail(f.Rel, err)
			case skip:
				if h.prog != nil {
					h.prog.Add(f.Size)
				}
			default:
				smu.Lock()
				send = append(send, h)
				smu.Unlock()
			}
		})
		t := time.Now()
		sums, err := sendFile(ctx, f, send)
		if err != nil {
			for _, h := range send {
				if errors.Is(err, ErrSourceChanged) {
					// The chunks sent are not of the file planned: none
					// of them is worth keeping.
					h.forget(f.Rel)
				}
				h.fail(f.Rel, err)
			}
		}
		for _, h := range live(send) {
			h.fr[f.Rel].Seconds += time.Since(t).Seconds()
			fin = append(fin, h)
		}
		each(fin, func(h *host) {
			t := time.Now()
			err := h.finish(ctx, f, sums)
			fr := h.fr[f.Rel]
			fr.Seconds += time.Since(t).Seconds()
			if err != nil {
				h.fail(f.Rel, err)
				return
			}
			fr.Verified = true
			h.rep.Bytes += f.Size
			if err := h.journal(jEntry{kind: jDone, rel: f.Rel, digest: f.Digest}); err != nil {
				h.fail(f.Rel, err)
			}
		})
	}
	each(live(hosts), func(h *host) { h.links(ctx) })
	close(stop)

	var failed []*HostError
	var names []string
	for _, h := range hosts {
		for _, c := range h.slots {
			if c != nil {
				c.close()
			}
		}
		if h.prog != nil {
			h.prog.Close()
		}
		r := h.report()
		if e := h.err(); e != nil {
			failed = append(failed, e)
			names = append(names, h.d.Name)
		} else if ctx.Err() != nil {
			e := &HostError{Dest: h.d.Name, Err: ctx.Err()}
			failed = append(failed, e)
			names = append(names, h.d.Name)
			r.Error = e.Err.Error()
		} else {
			r.OK = true
		}
		if h.jl != nil {
			if r.OK {
				h.jl.Remove()
			} else {
				h.jl.Close()
			}
		}
		rep.Hosts = append(rep.Hosts, r)
	}
	if len(failed) > 0 {
		return rep, &FailedError{Hosts: failed, Of: len(hosts), Failed: names}
	}
	return rep, nil
}

func (h *host) report() HostReport {
	r := h.rep
	r.Sent = h.sent.Load()
	r.Seconds = time.Since(h.start).Seconds()
	r.MBps = mbps(r.Sent, r.Seconds)
	for _, f := range h.p.Files {
		if fr := h.fr[f.Rel]; fr != nil {
			fr.MBps = mbps(fr.Sent, fr.Seconds)
			r.Files = append(r.Files, *fr)
		}
	}
	if e := h.err(); e != nil {
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

// sendFile reads every chunk of f once, in order, and hands each chunk a
// destination lacks to the streams of every destination that lacks it.
// It returns the sha256 of every chunk as read (the streams hash the
// chunks they send, other goroutines the rest, so the reading never waits
// on hashing) after checking that the chunks, in order, hash to f.Digest:
// what was sent is the file planned, or ErrSourceChanged. The finishing
// checks compare each remote chunk with these digests.
func sendFile(ctx context.Context, f *File, hosts []*host) ([]digest.Digest, error) {
	if len(hosts) == 0 {
		return nil, nil
	}
	o := hosts[0].o
	cs := hosts[0].p.ChunkSize
	lf, err := os.Open(f.Path)
	if err != nil {
		return nil, err
	}
	defer lf.Close()
	if err := sameStamp(lf, f); err != nil {
		return nil, err
	}
	n := f.Chunks(cs)
	sums := make([]digest.Digest, n)
	bufLen := int(min(cs, max(f.Size, 1)))
	workers := o.Streams * o.Sessions
	// A buffer is held by the streams writing its chunk, by the file
	// hash until it has taken the chunk in, and by the goroutine hashing
	// a chunk no stream sends.
	pool := make(chan []byte, workers+3)
	for range workers + 3 {
		pool <- nil
	}
	// The file's hash takes the chunks in order, beside the streams.
	whole := sha256.New()
	inOrder := make(chan *job, 2)
	hashed := make(chan struct{})
	go func() {
		defer close(hashed)
		for j := range inOrder {
			whole.Write(j.data)
			j.release()
		}
	}()
	var wg, side sync.WaitGroup
	chans := make([]chan *job, len(hosts))
	vers := make([]*verifier, len(hosts))
	for hi, h := range hosts {
		chans[hi] = make(chan *job)
		part := h.remote(f.Rel) + ".partial"
		vers[hi] = h.startVerifier(ctx, part, n)
		needed := 0
		for _, n := range h.need {
			if n {
				needed++
			}
		}
		// No more workers than chunks to send, so that a small file opens
		// no connection it has no chunk for.
		for slot := range min(workers, needed) {
			wg.Go(func() {
				// Each worker connects and opens the partial at once, before
				// it takes a chunk: a chunk taken by a worker still dialing
				// would wait there, and hold one of the few buffers, while
				// connected workers idle. A failure here is left to the
				// first chunk's retries.
				if c, err := h.connect(ctx, slot); err == nil {
					c.open(part)
				}
				for j := range chans[hi] {
					if h.err() == nil && ctx.Err() == nil {
						h.sendJob(ctx, slot, f, j, vers[hi])
					}
					j.release()
				}
			})
		}
	}
	var rerr error
	read := 0 // chunks read, in order
	for idx := 0; idx < n && rerr == nil; idx++ {
		if len(live(hosts)) == 0 {
			break
		}
		var to []int
		for hi, h := range hosts {
			if h.need[idx] && h.err() == nil {
				to = append(to, hi)
			}
		}
		var buf []byte
		select {
		case buf = <-pool:
		case <-ctx.Done():
			rerr = ctx.Err()
			continue
		}
		if buf == nil {
			buf = make([]byte, bufLen)
		}
		off := int64(idx) * cs
		data := buf[:min(cs, f.Size-off)]
		if _, err := lf.ReadAt(data, off); err != nil {
			pool <- buf
			if err == io.EOF {
				err = fmt.Errorf("%w: shorter than %d bytes", ErrSourceChanged, f.Size)
			}
			rerr = fmt.Errorf("%s: %w", f.Path, err)
			continue
		}
		read++
		j := &job{idx: idx, off: off, data: data, sums: sums, pool: pool}
		j.refs.Store(int32(len(to)) + 1)
		if len(to) == 0 {
			j.refs.Add(1)
			side.Go(func() { j.digest(); j.release() })
		}
		inOrder <- j
		for _, hi := range to {
			select {
			case chans[hi] <- j:
			case <-ctx.Done():
				j.release()
				rerr = ctx.Err()
			}
		}
	}
	for _, c := range chans {
		close(c)
	}
	wg.Wait()
	for hi, h := range hosts {
		h.verified = vers[hi].wait()
	}
	side.Wait()
	close(inOrder)
	<-hashed
	if rerr == nil && read == n {
		if d := digest.New(whole.Sum(nil)); d != f.Digest {
			rerr = fmt.Errorf("%s: %w: it was %s when planned, its bytes read for sending are %s", f.Path, ErrSourceChanged, f.Digest.Short(), d.Short())
		}
	}
	if rerr == nil {
		rerr = sameStamp(lf, f)
	}
	return sums, rerr
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

// sendJob writes one chunk from stream slot and journals it.
func (h *host) sendJob(ctx context.Context, slot int, f *File, j *job, v *verifier) {
	h.o.Log.Debug("transfer: sending chunk", "dest", h.d.Name, "file", f.Rel, "chunk", j.idx, "offset", j.off, "bytes", len(j.data))
	if err := h.writeChunk(ctx, slot, f, j.off, j.data); err != nil {
		if ctx.Err() == nil {
			h.fail(f.Rel, err)
		}
		return
	}
	sum := j.digest()
	h.sent.Add(int64(len(j.data)))
	st := h.stateOf(f.Rel)
	h.jmu.Lock()
	st.chunks[j.idx] = sum
	fr := h.fr[f.Rel]
	fr.Sent += int64(len(j.data))
	fr.Chunks++
	h.jmu.Unlock()
	if err := h.journal(jEntry{kind: jChunk, rel: f.Rel, chunk: j.idx, end: j.off + int64(len(j.data)), digest: sum}); err != nil {
		h.fail(f.Rel, err)
		return
	}
	v.add(j.idx, sum)
}

// verifier hashes chunks on the remote host as soon as they are written,
// while the rest of the file is still being sent, so that the check
// after the last byte is left with the chunks it could not do: those of
// an earlier run, and the last few. Its failures are not the file's: a
// chunk it could not check, or found different, is checked again (and
// re-sent) by finishByChunks.
type verifier struct {
	h    *host
	part string
	ch   chan vjob
	wg   sync.WaitGroup
	mu   sync.Mutex
	ok   map[int]bool
}

type vjob struct {
	idx int
	sum digest.Digest
}

// verifiersPerConn is how many chunks a verifier hashes at once on each
// stream's connection during the send (sessions beside its SFTP ones).
const verifiersPerConn = 2

// startVerifier starts the verifier of the partial part (n chunks), or
// returns nil where chunks are not hashed on the remote host.
func (h *host) startVerifier(ctx context.Context, part string, n int) *verifier {
	if !h.ranges {
		return nil
	}
	v := &verifier{h: h, part: part, ch: make(chan vjob, n), ok: map[int]bool{}}
	for g := range h.o.Streams * verifiersPerConn {
		slot := (g % h.o.Streams) * h.o.Sessions
		v.wg.Go(func() {
			for j := range v.ch {
				if ctx.Err() != nil || h.err() != nil {
					continue
				}
				// One try, on the stream's connection as it is: what
				// fails here is checked again after the last byte.
				c := h.slot(slot)
				if c == nil {
					continue
				}
				c.busy.Add(1)
				d, err := h.rangeHashOn(ctx, c, part, j.idx)
				c.busy.Add(-1)
				if err == nil && d == j.sum {
					v.mu.Lock()
					v.ok[j.idx] = true
					v.mu.Unlock()
				}
			}
		})
	}
	return v
}

// add queues chunk idx, just written with digest sum (never blocks: the
// queue holds every chunk of the file).
func (v *verifier) add(idx int, sum digest.Digest) {
	if v != nil {
		v.ch <- vjob{idx, sum}
	}
}

// wait ends the verifier and returns the chunks it found right.
func (v *verifier) wait() map[int]bool {
	if v == nil {
		return nil
	}
	close(v.ch)
	v.wg.Wait()
	return v.ok
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
