package transfer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"

	"github.com/ferry-llm/ferry/internal/errkind"
)

// sftpDest is one destination reached over SSH: a pool of connections,
// each carrying SFTP sessions that write and a few remote commands that
// list and hash. Every operation runs through do or doExec, which connect
// on first use, retry after transient errors on a new connection, and
// leave the stall watch to close a connection that makes no progress.
type sftpDest struct {
	d   Destination
	o   *Options
	dir string // the remote directory as SFTP and the shell take it
	log *slog.Logger

	mu    sync.Mutex
	slots []*session // Streams × Sessions SFTP sessions, made on first use
	conns []*sshConn // Streams SSH connections

	// Learnt from the first SFTP session (learn).
	extMu   sync.Mutex
	learnt  bool
	packet  int
	posix   bool // posix-rename@openssh.com
	fsync   bool // fsync@openssh.com
	statvfs bool // statvfs@openssh.com

	// Learnt from the first remote command (probeTools).
	toolMu sync.Mutex
	tools  *remoteTools

	// The mode the server gives a file it creates, once seen.
	createMode atomic.Uint32
	modeKnown  atomic.Bool

	requests atomic.Int64 // SFTP requests sent
	commands atomic.Int64 // remote commands run
}

// remoteTools is what the remote shell offers for verification.
type remoteTools struct {
	hashCmd string // a sha256 tool that hashes right ("": none; files are read back)
	ranges  bool   // dd cuts chunks for hashCmd: files are verified chunk by chunk
	syncfs  bool   // sync -f: one command makes a file system's writes durable
	stat    string // prints files' mtimes (unix seconds), one a line: "stat -c %Y" (GNU), "stat -f %m" (BSD), or ""
	label   string // what reports call the check ("": from hashCmd)
}

func newSFTPDest(d Destination, o *Options) *sftpDest {
	dir := d.Dir
	switch {
	case dir == "~" || dir == "":
		dir = "."
	case strings.HasPrefix(dir, "~/"):
		dir = strings.TrimPrefix(dir, "~/")
	}
	s := &sftpDest{d: d, o: o, dir: path.Clean(dir), log: o.Log,
		slots: make([]*session, o.Streams*o.Sessions), conns: make([]*sshConn, o.Streams)}
	for i := range s.conns {
		s.conns[i] = &sshConn{exec: make(chan struct{}, max(1, maxExecPerConn-o.Sessions))}
	}
	return s
}

// remote is rel's path on the remote host.
func (s *sftpDest) remote(rel string) string { return path.Join(s.dir, rel) }

// sshConn is one stream's SSH connection, shared by its sessions and the
// remote commands run on it.
type sshConn struct {
	mu   sync.Mutex // held while dialing
	smu  sync.Mutex // held while making a session on it
	ssh  *ssh.Client
	dead chan struct{} // closed when the connection is gone
	exec chan struct{} // one token per remote command running on it
}

// session is one SFTP session on a connection.
type session struct {
	ssh     *ssh.Client
	sftp    *sftp.Client
	busy    atomic.Int32
	last    atomic.Int64 // unix ns of the last progress
	stalled atomic.Bool
	dead    chan struct{} // closed when the SSH connection is gone

	fmu   sync.Mutex
	files map[string]*sftp.File // open partials, by remote path
}

func (c *session) touch() { c.last.Store(time.Now().UnixNano()) }

func (c *session) close() {
	c.fmu.Lock()
	for _, f := range c.files {
		f.Close()
	}
	c.files = nil
	c.fmu.Unlock()
	if c.sftp != nil {
		c.sftp.Close()
	}
}

// open returns the session's handle on the remote file p, opened for
// writing, and keeps it for the next chunk.
func (c *session) open(p string) (*sftp.File, error) {
	c.fmu.Lock()
	defer c.fmu.Unlock()
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

func (c *session) closeFile(p string) {
	c.fmu.Lock()
	f := c.files[p]
	delete(c.files, p)
	c.fmu.Unlock()
	if f != nil {
		f.Close()
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// conn returns SSH connection i, dialing it if it is not up.
func (s *sftpDest) conn(ctx context.Context, i int) (*ssh.Client, chan struct{}, error) {
	g := s.conns[i]
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ssh != nil && isClosed(g.dead) {
		g.ssh = nil
	}
	if g.ssh == nil {
		dctx, cancel := context.WithTimeout(ctx, s.o.DialTimeout)
		sc, err := s.d.Dial(dctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil, ctx.Err()
			}
			return nil, nil, err
		}
		dead := make(chan struct{})
		go func() { sc.Wait(); close(dead) }()
		g.ssh, g.dead = sc, dead
	}
	return g.ssh, g.dead, nil
}

// slot is slot i's session if it is up.
func (s *sftpDest) slot(i int) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.slots[i]; c != nil && !isClosed(c.dead) {
		return c
	}
	return nil
}

// session returns slot i's SFTP session, connecting it if it is not up.
func (s *sftpDest) session(ctx context.Context, i int) (*session, error) {
	if c := s.slot(i); c != nil {
		return c, nil
	}
	g := s.conns[i/s.o.Sessions]
	// One goroutine at a time makes a connection's sessions; the others
	// wait and take what it made.
	g.smu.Lock()
	defer g.smu.Unlock()
	if c := s.slot(i); c != nil {
		return c, nil
	}
	sc, dead, err := s.conn(ctx, i/s.o.Sessions)
	if err != nil {
		return nil, err
	}
	err = s.learn(sc)
	var fc *sftp.Client
	if err == nil {
		fc, err = s.newClient(sc)
	}
	if err != nil {
		sc.Close()
		return nil, deadOr(dead, fmt.Errorf("starting SFTP: %w", err))
	}
	c := &session{ssh: sc, sftp: fc, dead: dead}
	c.touch()
	s.mu.Lock()
	old := s.slots[i]
	s.slots[i] = c
	s.mu.Unlock()
	if old != nil {
		old.close()
	}
	return c, nil
}

// learn asks the server, once, which extensions and packet size it
// takes, on an SFTP session of its own: every session is then made with
// the largest packet the server allows.
func (s *sftpDest) learn(sc *ssh.Client) error {
	s.extMu.Lock()
	defer s.extMu.Unlock()
	if s.learnt {
		return nil
	}
	fc, err := s.newClient(sc)
	if err != nil {
		return err
	}
	defer fc.Close()
	_, s.posix = fc.HasExtension("posix-rename@openssh.com")
	v, ok := fc.HasExtension("fsync@openssh.com")
	s.fsync = ok && v == "1"
	_, s.statvfs = fc.HasExtension("statvfs@openssh.com")
	s.packet = 32 * 1024
	if s.o.MaxPacket > 0 {
		s.packet = s.o.MaxPacket
	} else if _, ok := fc.HasExtension("limits@openssh.com"); ok {
		s.packet = openSSHMaxData
	}
	s.learnt = true
	return nil
}

// openSSHMaxData is the largest read or write OpenSSH's sftp-server takes
// (SFTP_MAX_READ_LENGTH, 256 KiB less 1024 for the header; sftp-server.c).
const openSSHMaxData = 256*1024 - 1024

// newClient starts an SFTP session on sc whose requests are counted.
func (s *sftpDest) newClient(sc *ssh.Client) (*sftp.Client, error) {
	ss, err := sc.NewSession()
	if err != nil {
		return nil, err
	}
	w, err := ss.StdinPipe()
	if err != nil {
		ss.Close()
		return nil, err
	}
	r, err := ss.StdoutPipe()
	if err != nil {
		ss.Close()
		return nil, err
	}
	ss.Stderr = io.Discard
	if err := ss.RequestSubsystem("sftp"); err != nil {
		ss.Close()
		return nil, err
	}
	opts := []sftp.ClientOption{sftp.UseConcurrentWrites(true), sftp.UseConcurrentReads(true)}
	if s.packet > 0 {
		opts = append(opts, sftp.MaxPacketUnchecked(s.packet))
	}
	fc, err := sftp.NewClientPipe(r, &packetCounter{w: w, n: &s.requests}, opts...)
	if err != nil {
		ss.Close()
		return nil, err
	}
	return fc, nil
}

// packetCounter counts the SFTP packets written through it (each is one
// request the server answers: a uint32 length, then that many bytes), and
// hands each small packet to the channel in one write: pkg/sftp writes a
// packet's header and its payload apart, and each write to an SSH channel
// is an SSH packet of its own, encrypted, sent and decrypted alone.
type packetCounter struct {
	w    io.WriteCloser
	n    *atomic.Int64
	hdr  [4]byte
	nhdr int   // bytes of the current length read
	left int64 // bytes of the current packet still to come
	buf  []byte

	inited bool
}

// coalesce is the largest packet handed to the channel in one write.
const coalesce = 64 << 10

func (p *packetCounter) Write(b []byte) (int, error) {
	for rest := b; len(rest) > 0; {
		if p.left > 0 {
			k := min(int64(len(rest)), p.left)
			p.left -= k
			rest = rest[k:]
			continue
		}
		k := copy(p.hdr[p.nhdr:], rest)
		p.nhdr += k
		rest = rest[k:]
		if p.nhdr == 4 {
			p.left = int64(binary.BigEndian.Uint32(p.hdr[:]))
			p.nhdr = 0
			if p.inited {
				p.n.Add(1)
			}
			p.inited = true // the session's INIT is not a request
		}
	}
	boundary := p.left == 0 && p.nhdr == 0
	if len(p.buf)+len(b) <= coalesce {
		p.buf = append(p.buf, b...)
		if boundary {
			return len(b), p.flush()
		}
		return len(b), nil
	}
	if err := p.flush(); err != nil {
		return 0, err
	}
	return p.w.Write(b)
}

func (p *packetCounter) flush() error {
	if len(p.buf) == 0 {
		return nil
	}
	_, err := p.w.Write(p.buf)
	p.buf = p.buf[:0]
	return err
}

func (p *packetCounter) Close() error {
	err := p.flush()
	if cerr := p.w.Close(); err == nil {
		err = cerr
	}
	return err
}

// drop closes slot i's session c after an error on it, unless another
// goroutine already replaced it.
func (s *sftpDest) drop(i int, c *session) {
	s.mu.Lock()
	if s.slots[i] != c {
		s.mu.Unlock()
		return
	}
	s.slots[i] = nil
	s.mu.Unlock()
	c.close()
}

// do runs f on slot i's session, reconnecting and retrying after transient
// errors, with a bounded backoff.
func (s *sftpDest) do(ctx context.Context, i int, what string, f func(c *session) error) error {
	for attempt := 0; ; attempt++ {
		c, err := s.session(ctx, i)
		if err == nil {
			c.busy.Add(1)
			c.touch()
			err = f(c)
			c.busy.Add(-1)
			if err != nil && c.stalled.Load() {
				err = fmt.Errorf("%w: no progress for %v (%v)", errStalled, s.o.StallTimeout, err)
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
		if !retryable(err) || attempt >= s.o.Retries {
			if retryable(err) {
				err = errkind.Errorf(errkind.Failure, "%w (gave up after %d retries)", err, attempt)
			}
			return err
		}
		if c != nil {
			s.drop(i, c)
		}
		if err := s.backoff(ctx, attempt, what, err); err != nil {
			return err
		}
	}
}

func (s *sftpDest) backoff(ctx context.Context, attempt int, what string, err error) error {
	wait := min(s.o.Backoff<<attempt, 5*time.Second)
	wait = wait/2 + rand.N(wait/2+1)
	s.log.Info("transfer: retrying", "dest", s.d.Name, "what", what, "attempt", attempt+1, "in", wait.Round(time.Millisecond), "err", err)
	select {
	case <-time.After(wait):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// doExec runs f, a remote command that reads about n bytes there, on SSH
// connection i, at most maxExecPerConn-Sessions at once on a connection,
// retrying after transient errors. The connection carries nothing while
// the tool reads, so the stall watch leaves it alone; instead the command
// has a time bound of its own (the stall timeout, at least 2 s, plus n at
// 10 MB/s): a connection that died under it is then given up and the
// command run again on a new one, instead of waiting for an answer that
// cannot come.
func (s *sftpDest) doExec(ctx context.Context, i int, n int64, what string, f func(ctx context.Context, c *ssh.Client) error) error {
	g := s.conns[i]
	select {
	case g.exec <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-g.exec }()
	limit := max(s.o.StallTimeout, 2*time.Second) + time.Duration(n/10e6)*time.Second
	for attempt := 0; ; attempt++ {
		sc, dead, err := s.conn(ctx, i)
		if err == nil {
			tctx, cancel := context.WithTimeout(ctx, limit)
			s.commands.Add(1)
			err = f(tctx, sc)
			if err != nil && ctx.Err() == nil && tctx.Err() != nil {
				err = fmt.Errorf("%w: the remote command gave no answer in %v", errStalled, limit)
			} else if err != nil {
				err = deadOr(dead, err)
			}
			cancel()
		}
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !retryable(err) || attempt >= s.o.Retries {
			if retryable(err) {
				err = errkind.Errorf(errkind.Failure, "%w (gave up after %d retries)", err, attempt)
			}
			return err
		}
		if sc != nil {
			sc.Close()
		}
		if err := s.backoff(ctx, attempt, what, err); err != nil {
			return err
		}
	}
}

// watch closes connections that make no progress for StallTimeout while
// an operation runs on them, and every connection when ctx ends (pkg/sftp
// calls take no context).
func (s *sftpDest) watch(ctx context.Context, stop <-chan struct{}) {
	t := time.NewTicker(max(s.o.StallTimeout/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			s.closeAll()
			return
		case <-t.C:
			now := time.Now().UnixNano()
			s.mu.Lock()
			slots := append([]*session(nil), s.slots...)
			s.mu.Unlock()
			for _, c := range slots {
				if c != nil && c.busy.Load() > 0 && now-c.last.Load() > int64(s.o.StallTimeout) {
					c.stalled.Store(true)
					c.ssh.Close()
				}
			}
		}
	}
}

// closeAll closes every session and connection.
func (s *sftpDest) closeAll() {
	s.mu.Lock()
	slots := append([]*session(nil), s.slots...)
	clear(s.slots)
	s.mu.Unlock()
	for _, c := range slots {
		if c != nil {
			c.close()
		}
	}
	for _, g := range s.conns {
		g.mu.Lock()
		if g.ssh != nil {
			g.ssh.Close()
			g.ssh = nil
		}
		g.mu.Unlock()
	}
}

// metaSlot is the session for metadata item k (a listing, a directory, a
// link, a removal): the first connection's sessions, so that work of a
// few round trips opens no more connections.
func (s *sftpDest) metaSlot(k int) int { return k % s.o.Sessions }

// slotOf spreads work item k over the sessions: consecutive items go to
// different connections first.
func (s *sftpDest) slotOf(k int) int {
	n := s.o.Streams * s.o.Sessions
	k %= n
	return (k%s.o.Streams)*s.o.Sessions + k/s.o.Streams
}

// errNotDir is what mkdir finds where a directory should be.
var errNotDir = errkind.New(errkind.BadInput, "exists and is not a directory")

// mkdir makes the remote directory p (with its parents when all),
// refusing a path that exists as something else.
func (s *sftpDest) mkdir(c *session, p string, all bool) error {
	fi, err := c.sftp.Stat(p)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		return fmt.Errorf("remote path %s %w", p, errNotDir)
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("remote %s: %w", p, err)
	case all:
		if err := c.sftp.MkdirAll(p); err != nil {
			return fmt.Errorf("creating remote directory %s: %w", p, err)
		}
	default:
		if err := c.sftp.Mkdir(p); err != nil {
			// Made meanwhile by another run is fine.
			if fi, serr := c.sftp.Stat(p); serr == nil && fi.IsDir() {
				return nil
			}
			return fmt.Errorf("creating remote directory %s: %w", p, err)
		}
	}
	return nil
}

// mkdirNew makes the remote directory p, which a listing said is not
// there: one request, and a stat only if it fails.
func (s *sftpDest) mkdirNew(c *session, p string) error {
	err := c.sftp.Mkdir(p)
	if err == nil {
		return nil
	}
	fi, serr := c.sftp.Stat(p)
	switch {
	case serr == nil && fi.IsDir():
		return nil // made meanwhile by another run
	case serr == nil:
		return fmt.Errorf("remote path %s %w", p, errNotDir)
	}
	return fmt.Errorf("creating remote directory %s: %w", p, err)
}
