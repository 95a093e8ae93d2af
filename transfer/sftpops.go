package transfer

import (
	"bytes"
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
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"
	"golang.org/x/sync/errgroup"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/progress"
)

// The operations the fan-out core asks of an SSH destination. Paths are
// relative to the destination directory; a file is written to REL.partial
// and renamed to REL once verified.

// probeTools finds, once, the remote sha256 tool, whether dd cuts chunks
// for it, whether sync -f works and which stat there is: one remote
// command (none when list already probed).
func (s *sftpDest) probeTools(ctx context.Context) (*remoteTools, error) {
	s.toolMu.Lock()
	defer s.toolMu.Unlock()
	if s.tools != nil {
		return s.tools, nil
	}
	var out []byte
	err := s.doExec(ctx, 0, 0, "probe remote tools", func(ctx context.Context, c *ssh.Client) (err error) {
		out, err = run(ctx, c, probeScript(), nil)
		var ee *exitError
		if errors.As(err, &ee) {
			// No POSIX shell there (an SFTP-only account): files are read back.
			out, err = nil, nil
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	s.tools = s.parseTools(out)
	return s.tools, nil
}

// setTools keeps the tools a probe's answer out names.
func (s *sftpDest) setTools(out []byte) {
	s.toolMu.Lock()
	defer s.toolMu.Unlock()
	s.tools = s.parseTools(out)
}

// parseTools reads a probe's answer; one that does not parse (no shell,
// an SFTP-only account) means no tools: files are read back.
func (s *sftpDest) parseTools(out []byte) *remoteTools {
	if out == nil {
		return &remoteTools{}
	}
	t, err := parseProbe(out)
	if err != nil {
		s.log.Info("transfer: the remote shell did not run the tool probe; verifying by reading files back", "dest", s.d.Name, "err", err)
		return &remoteTools{}
	}
	return t
}

// list returns what the destination holds under the roots (names
// relative to its directory): one remote command where the shell has GNU
// find or BSD stat, else SFTP directory reads of the plan's directories
// (dirs) and stats of its top-level files. missing says the destination
// directory itself does not exist. With probe, the same command probes the
// remote tools (probeTools's answer is then known).
func (s *sftpDest) list(ctx context.Context, roots, dirs []string, probe bool) (m map[string]entry, missing bool, err error) {
	// Names with a newline would break the one-line-per-path listings.
	odd := false
	for _, r := range append(append([]string(nil), roots...), dirs...) {
		odd = odd || strings.ContainsAny(r, "\n\x00")
	}
	if !odd && len(roots) > 0 {
		cmd := listScript(s.dir, roots)
		if probe {
			cmd = probeAndListScript(s.dir, roots)
		}
		var out []byte
		err = s.doExec(ctx, 0, 0, "list "+s.dir, func(ctx context.Context, c *ssh.Client) (err error) {
			out, err = run(ctx, c, cmd, nil)
			var ee *exitError
			if errors.As(err, &ee) {
				out, err = nil, nil // no POSIX shell: listed over SFTP below
			}
			return err
		})
		if err != nil {
			return nil, false, err
		}
		if probe && out != nil {
			p, rest, ok := bytes.Cut(out, []byte(probedMark))
			if ok {
				s.setTools(p)
				out = rest
			}
		}
		if out != nil {
			m, err = parseListing(out)
			switch {
			case errors.Is(err, errNoDir):
				return map[string]entry{}, true, nil
			case err == nil:
				return m, false, s.linkTargets(ctx, m)
			}
			s.log.Debug("transfer: no remote listing tool; listing over SFTP", "dest", s.d.Name, "err", err)
		}
	}
	return s.listSFTP(ctx, roots, dirs)
}

// linkTargets reads the targets of the symlinks in m.
func (s *sftpDest) linkTargets(ctx context.Context, m map[string]entry) error {
	var links []string
	for p, e := range m {
		if e.kind == 'l' {
			links = append(links, p)
		}
	}
	if len(links) == 0 {
		return nil
	}
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for k, p := range links {
		g.Go(func() error {
			return s.do(gctx, s.metaSlot(k), "readlink "+p, func(c *session) error {
				t, err := c.sftp.ReadLink(s.remote(p))
				if err != nil {
					if errors.Is(err, os.ErrNotExist) {
						return nil
					}
					return err
				}
				mu.Lock()
				e := m[p]
				e.target = t
				m[p] = e
				mu.Unlock()
				return nil
			})
		})
	}
	return g.Wait()
}

// listSFTP is list over SFTP: the roots that are directories are read
// recursively (one directory read a directory, many at once), the others
// stat'ed.
func (s *sftpDest) listSFTP(ctx context.Context, roots, dirs []string) (map[string]entry, bool, error) {
	m := map[string]entry{}
	var mu sync.Mutex
	missing := false
	err := s.do(ctx, 0, "stat "+s.dir, func(c *session) error {
		fi, err := c.sftp.Stat(s.dir)
		switch {
		case errors.Is(err, os.ErrNotExist):
			missing = true
			return nil
		case err != nil:
			return fmt.Errorf("remote %s: %w", s.dir, err)
		case !fi.IsDir():
			return fmt.Errorf("remote path %s %w", s.dir, errNotDir)
		}
		return nil
	})
	if err != nil || missing {
		return m, missing, err
	}
	put := func(rel string, fi os.FileInfo) {
		e := entry{size: fi.Size(), alloc: -1, mtime: fi.ModTime().Unix(), kind: '?'}
		switch {
		case fi.Mode().IsRegular():
			e.kind = 'f'
		case fi.IsDir():
			e.kind = 'd'
		case fi.Mode()&fs.ModeSymlink != 0:
			e.kind = 'l'
		}
		mu.Lock()
		m[rel] = e
		mu.Unlock()
	}
	level := roots
	for depth := 0; len(level) > 0 && depth <= maxDepth; depth++ {
		var next []string
		var nmu sync.Mutex
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(32)
		for k, rel := range level {
			g.Go(func() error {
				return s.do(gctx, s.metaSlot(k), "list "+rel, func(c *session) error {
					p := s.remote(rel)
					if depth == 0 {
						fi, err := c.sftp.Lstat(p)
						if errors.Is(err, os.ErrNotExist) {
							return nil
						}
						if err != nil {
							return fmt.Errorf("remote %s: %w", p, err)
						}
						put(rel, fi)
						if !fi.IsDir() {
							return nil
						}
					}
					fis, err := c.sftp.ReadDir(p)
					if errors.Is(err, os.ErrNotExist) {
						return nil
					}
					if err != nil {
						return fmt.Errorf("remote %s: %w", p, err)
					}
					for _, fi := range fis {
						r := path.Join(rel, fi.Name())
						put(r, fi)
						if fi.IsDir() {
							nmu.Lock()
							next = append(next, r)
							nmu.Unlock()
						}
					}
					return nil
				})
			})
		}
		if err := g.Wait(); err != nil {
			return nil, false, err
		}
		sort.Strings(next)
		level = next
	}
	return m, false, s.linkTargets(ctx, m)
}

// mkdirs creates the directories (slash paths, parents first) that m does
// not hold, a level at a time, each level's directories at once; top
// makes the destination directory itself first.
func (s *sftpDest) mkdirs(ctx context.Context, dirs []string, m map[string]entry, top bool) error {
	if top {
		if err := s.do(ctx, 0, "mkdir "+s.dir, func(c *session) error { return s.mkdir(c, s.dir, true) }); err != nil {
			return err
		}
	}
	byDepth := map[int][]string{}
	depths := []int{}
	for _, d := range dirs {
		if e, ok := m[d]; ok {
			if e.kind != 'd' {
				return fmt.Errorf("remote path %s %w", s.remote(d), errNotDir)
			}
			continue
		}
		n := strings.Count(d, "/")
		if _, ok := byDepth[n]; !ok {
			depths = append(depths, n)
		}
		byDepth[n] = append(byDepth[n], d)
	}
	sort.Ints(depths)
	for _, n := range depths {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(64)
		for k, d := range byDepth[n] {
			g.Go(func() error {
				return s.do(gctx, s.metaSlot(k), "mkdir "+d, func(c *session) error { return s.mkdirNew(c, s.remote(d)) })
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
	}
	return nil
}

// space is the room left where the files go: free is what an unprivileged
// writer may use; known is false where the server does not say, or says
// nothing useful (a file system of no blocks: /proc, sysfs).
func (s *sftpDest) space(ctx context.Context) (free int64, known bool, err error) {
	err = s.do(ctx, 0, "statvfs "+s.dir, func(c *session) error {
		if !s.statvfs {
			return nil
		}
		vfs, err := c.sftp.StatVFS(s.dir)
		if err != nil {
			return nil // the writes will say
		}
		if vfs.Blocks == 0 || vfs.Frsize == 0 {
			return nil
		}
		free, known = int64(vfs.Bavail)*int64(vfs.Frsize), true
		return nil
	})
	return free, known, err
}

// putSmall writes data as rel's partial (created or truncated) from slot,
// fsynced when sync (where sync -f will not make it durable before the
// check), and closes it.
func (s *sftpDest) putSmall(ctx context.Context, slot int, rel string, data []byte, sync bool, prog progress.Reporter) error {
	part := s.remote(rel) + ".partial"
	return s.do(ctx, slot, "write "+part, func(c *session) error {
		pf, err := c.sftp.OpenFile(part, os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
		if err != nil {
			return s.explain(c, fmt.Errorf("creating %s: %w", part, err), int64(len(data)))
		}
		if len(data) > 0 {
			_, err = pf.WriteAt(data, 0)
			c.touch()
		}
		if err == nil && !s.modeKnown.Load() {
			// The mode the server gives a new file (0666 less its umask):
			// a file to have it needs no chmod.
			var fi os.FileInfo
			if fi, err = pf.Stat(); err == nil {
				s.createMode.Store(uint32(fi.Mode().Perm()))
				s.modeKnown.Store(true)
			}
		}
		if err == nil && sync && s.fsync {
			err = pf.Sync()
		}
		if cerr := pf.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return s.explain(c, fmt.Errorf("writing %s: %w", part, err), int64(len(data)))
		}
		if prog != nil {
			prog.Add(int64(len(data)))
		}
		return nil
	})
}

// createPartial creates rel's partial with size bytes (a sparse file the
// chunks are written into), durable before it returns.
func (s *sftpDest) createPartial(ctx context.Context, slot int, rel string, size int64) error {
	part := s.remote(rel) + ".partial"
	return s.do(ctx, slot, "create "+part, func(c *session) error {
		pf, err := c.sftp.OpenFile(part, os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
		if err != nil {
			return s.explain(c, fmt.Errorf("creating %s: %w", part, err), 0)
		}
		err = pf.Truncate(size)
		if err == nil && s.fsync {
			err = pf.Sync()
		}
		if cerr := pf.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return s.explain(c, fmt.Errorf("creating %s: %w", part, err), 0)
		}
		return nil
	})
}

// writeChunk writes data at off into rel's partial from slot, and makes it
// durable (fsync@openssh.com) before it returns.
func (s *sftpDest) writeChunk(ctx context.Context, slot int, rel string, off int64, data []byte, sum func() digest.Digest, prog progress.Reporter) error {
	part := s.remote(rel) + ".partial"
	return s.do(ctx, slot, fmt.Sprintf("write %s at %d", part, off), func(c *session) error {
		pf, err := c.open(part)
		if err != nil {
			return fmt.Errorf("opening %s: %w", part, err)
		}
		// One chunk writer a session (the core's chunk workers, one per
		// slot): the handle's offset is this writer's.
		if _, err := pf.Seek(off, io.SeekStart); err != nil {
			return err
		}
		n, err := pf.ReadFromWithConcurrency(&progressReader{r: bytes.NewReader(data), c: c, prog: prog}, 0)
		if err == nil && n != int64(len(data)) {
			err = fmt.Errorf("wrote %d of %d bytes", n, len(data))
		}
		if err == nil && s.fsync {
			err = pf.Sync()
		}
		if err != nil {
			return s.explain(c, fmt.Errorf("writing %s at offset %d: %w", part, off, err), int64(len(data)))
		}
		return nil
	})
}

// closePartial closes the handles the sessions keep open on rel's partial.
func (s *sftpDest) closePartial(rel string) {
	part := s.remote(rel) + ".partial"
	s.mu.Lock()
	slots := append([]*session(nil), s.slots...)
	s.mu.Unlock()
	for _, c := range slots {
		if c != nil {
			c.closeFile(part)
		}
	}
}

// progressReader counts what is read for sending: the session is alive,
// and the destination's bar moves.
type progressReader struct {
	r    io.Reader
	c    *session
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

// explain adds what a remote write failure probably means: a full disk
// reports only SSH_FX_FAILURE. Only a file system that has blocks and
// fewer free than the write needed is called full; anything else (a
// read-only or virtual file system, permissions) is reported as it came.
func (s *sftpDest) explain(c *session, err error, need int64) error {
	if statusCode(err) != sshFxFailure || !s.statvfs {
		return err
	}
	vfs, verr := c.sftp.StatVFS(s.dir)
	if verr != nil || vfs.Blocks == 0 || vfs.Frsize == 0 {
		return err
	}
	free := int64(vfs.Bavail) * int64(vfs.Frsize)
	if free < max(need, 1<<20) {
		return fmt.Errorf("%w (%d bytes free): %v", ErrRemoteFull, free, err)
	}
	return err
}

// hashFiles hashes the remote files rels with the remote tool, in one
// command on connection conn (after sync -f, where it works, has made
// their writes durable), and returns their mtimes where the remote stat
// gives them (else nil). n is their total size, for the command's time
// bound.
func (s *sftpDest) hashFiles(ctx context.Context, conn int, t *remoteTools, rels []string, n int64) ([]digest.Digest, []int64, error) {
	var ds []digest.Digest
	var ts []int64
	err := s.doExec(ctx, conn, n, fmt.Sprintf("hash %d files", len(rels)), func(ctx context.Context, c *ssh.Client) error {
		out, err := run(ctx, c, "/bin/sh -c "+shQuote(hashListCommand(t, s.dir, "", rels)), nil)
		if err != nil {
			return err
		}
		ds, ts, err = parseHashList(out, len(rels), t.stat != "")
		return err
	})
	return ds, ts, err
}

// rangeHash hashes chunk i (chunk size cs) of the remote file rel on the
// remote host, over connection conn.
func (s *sftpDest) rangeHash(ctx context.Context, conn int, t *remoteTools, rel string, cs int64, i int, retry bool) (digest.Digest, error) {
	// Run by the login shell as it is, as scp's and rsync's remote ends
	// are (a /bin/sh around it costs one more process a chunk).
	cmd := rangeCommand(t.hashCmd, s.remote(rel), cs, i)
	var d digest.Digest
	f := func(ctx context.Context, c *ssh.Client) error {
		out, err := run(ctx, c, cmd, nil)
		if err != nil {
			return err
		}
		var ok bool
		if d, ok = parseDigest(out); !ok {
			return fmt.Errorf("remote %q printed no sha256: %q", t.hashCmd, firstLine(out))
		}
		return nil
	}
	if !retry {
		// One try on the connection as it is (the checks made while the
		// file is still being sent: what fails is checked again after).
		sc, _, err := s.conn(ctx, conn)
		if err != nil {
			return "", err
		}
		g := s.conns[conn]
		select {
		case g.exec <- struct{}{}:
		case <-ctx.Done():
			return "", ctx.Err()
		}
		defer func() { <-g.exec }()
		tctx, cancel := context.WithTimeout(ctx, max(s.o.StallTimeout, 2*time.Second)+time.Duration(cs/10e6)*time.Second)
		defer cancel()
		s.commands.Add(1)
		return d, f(tctx, sc)
	}
	err := s.doExec(ctx, conn, cs, fmt.Sprintf("hash chunk %d of %s", i, rel), f)
	return d, err
}

// readBack reads the remote file p (a path under the destination) over
// SFTP from slot and returns its digest and the digests of its chunks
// (chunk size cs).
func (s *sftpDest) readBack(ctx context.Context, slot int, p string, size, cs int64) (d digest.Digest, chunks []digest.Digest, err error) {
	err = s.do(ctx, slot, "read back "+p, func(c *session) error {
		rf, err := c.sftp.Open(s.remote(p))
		if err != nil {
			return fmt.Errorf("reading back %s: %w", s.remote(p), err)
		}
		defer rf.Close()
		whole := sha256.New()
		chunks = chunks[:0]
		buf := make([]byte, min(cs, max(size, 1)))
		for off := int64(0); off < size; {
			if err := ctx.Err(); err != nil {
				return err
			}
			b := buf[:min(int64(len(buf)), size-off)]
			n, err := rf.ReadAt(b, off)
			if n < len(b) {
				if err == nil || err == io.EOF {
					return fmt.Errorf("reading back %s: %d bytes, want %d", s.remote(p), off+int64(n), size)
				}
				return fmt.Errorf("reading back %s at offset %d: %w", s.remote(p), off, err)
			}
			c.touch()
			whole.Write(b)
			sum := sha256.Sum256(b)
			chunks = append(chunks, digest.New(sum[:]))
			off += int64(n)
		}
		d = digest.New(whole.Sum(nil))
		return nil
	})
	return d, chunks, err
}

// readBackChunk reads chunk i (chunk size cs) of rel's partial over SFTP
// and returns its sha256.
func (s *sftpDest) readBackChunk(ctx context.Context, slot int, rel string, size, cs int64, i int) (d digest.Digest, err error) {
	part := s.remote(rel) + ".partial"
	err = s.do(ctx, slot, fmt.Sprintf("read back chunk %d of %s", i, part), func(c *session) error {
		rf, err := c.sftp.Open(part)
		if err != nil {
			return fmt.Errorf("reading back %s: %w", part, err)
		}
		defer rf.Close()
		off := int64(i) * cs
		b := make([]byte, min(cs, size-off))
		if n, err := rf.ReadAt(b, off); n < len(b) {
			return fmt.Errorf("reading back %s at offset %d: %d of %d bytes: %v", part, off, n, len(b), err)
		}
		c.touch()
		sum := sha256.Sum256(b)
		d = digest.New(sum[:])
		return nil
	})
	return d, err
}

// rewriteChunk writes data at off into rel's partial (a repair), durable
// before it returns.
func (s *sftpDest) rewriteChunk(ctx context.Context, slot int, rel string, off int64, data []byte, sum func() digest.Digest) error {
	part := s.remote(rel) + ".partial"
	return s.do(ctx, slot, fmt.Sprintf("repair %s at %d", part, off), func(c *session) error {
		pf, err := c.sftp.OpenFile(part, os.O_WRONLY)
		if err != nil {
			return err
		}
		defer pf.Close()
		if _, err := pf.WriteAt(data, off); err != nil {
			return s.explain(c, fmt.Errorf("writing %s at offset %d: %w", part, off, err), int64(len(data)))
		}
		if s.fsync {
			return pf.Sync()
		}
		return nil
	})
}

// commit gives rel's verified partial its mode and renames it into place,
// replacing what is there. With stat it also returns the partial's mtime
// as the server lists it (the rename keeps it).
func (s *sftpDest) commit(ctx context.Context, slot int, rel string, perm fs.FileMode, modeSet, stat bool) (mtime int64, err error) {
	remote := s.remote(rel)
	part := remote + ".partial"
	err = s.do(ctx, slot, "rename "+part, func(c *session) error {
		var g errgroup.Group
		if !modeSet && (!s.modeKnown.Load() || fs.FileMode(s.createMode.Load()) != perm.Perm()) {
			g.Go(func() error {
				if err := c.sftp.Chmod(part, perm); err != nil {
					return fmt.Errorf("chmod %s: %w", part, err)
				}
				return nil
			})
		}
		if stat {
			g.Go(func() error {
				fi, err := c.sftp.Lstat(part)
				if err != nil {
					return fmt.Errorf("stat %s: %w", part, err)
				}
				mtime = fi.ModTime().Unix()
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
		var err error
		if s.posix {
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
	})
	return mtime, err
}

// symlink makes rel a link to target, replacing a file or another link
// there (e: what the listing found there, kind 0 for nothing).
func (s *sftpDest) symlink(ctx context.Context, slot int, rel, target string, e entry) error {
	remote := s.remote(rel)
	return s.do(ctx, slot, "link "+remote, func(c *session) error {
		switch e.kind {
		case 0:
		case 'd':
			return fmt.Errorf("remote path %s is a directory, the source has a link there: %w", remote, errNotDir)
		default:
			if err := c.sftp.Remove(remote); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
		if err := c.sftp.Symlink(target, remote); err != nil {
			return fmt.Errorf("making link %s -> %s: %w", remote, target, err)
		}
		return nil
	})
}

// remove deletes rel (a file, link or empty directory).
func (s *sftpDest) remove(ctx context.Context, slot int, rel string, dir bool) error {
	remote := s.remote(rel)
	return s.do(ctx, slot, "remove "+remote, func(c *session) error {
		var err error
		if dir {
			err = c.sftp.RemoveDirectory(remote)
		} else {
			err = c.sftp.Remove(remote)
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing %s: %w", remote, err)
		}
		return nil
	})
}

var _ = sftp.ErrSSHFxConnectionLost
