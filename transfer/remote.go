package transfer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/ferry-llm/ferry/internal/digest"
)

// hashCommands are the remote sha256 tools tried in order, each followed
// by quoted paths and printing a line per file with the digest as its
// first field. openssl comes first because it is the fastest where it is
// there (OpenSSL and LibreSSL use the CPU's SHA extensions; Debian 12's
// coreutils sha256sum does not: 1560 vs 470 MB/s on one machine, see the
// transfer notes); sha256sum is GNU coreutils (Linux), shasum the Perl
// script macOS ships.
var hashCommands = []string{"openssl dgst -sha256 -r", "sha256sum", "shasum -a 256"}

// emptySHA256 is the sha256 of no bytes: each candidate is probed by
// hashing an empty stdin, so a tool that is missing, broken or not sha256
// is never used.
var emptySHA256 = func() string { s := sha256.Sum256(nil); return hex.EncodeToString(s[:]) }()

// ReadBack names the verification that reads the remote file back over
// SFTP and hashes it locally, used where no remote hash command works.
const ReadBack = "read-back"

// shellQuote quotes a path for a POSIX shell: single quotes, each ' written
// as '\”. A relative path gets "./" in front so that no tool takes a name
// starting with "-" for an option.
func shellQuote(s string) string {
	if !strings.HasPrefix(s, "/") {
		s = "./" + s
	}
	return shQuote(s)
}

// shQuote quotes s for a POSIX shell.
func shQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// maxCommandOutput bounds what a remote command may print before it is
// given up (a listing of a huge tree, a tool gone wrong).
const maxCommandOutput = 256 << 20

// run runs cmd on the remote host with stdin from in and returns its
// stdout; stderr is added to the error. When ctx ends first, the
// connection is closed: opening the session or waiting for the command
// may hang on a connection that died under it (x/crypto/ssh takes no
// context), and the caller retries on a new one.
func run(ctx context.Context, c *ssh.Client, cmd string, in []byte) ([]byte, error) {
	return runStream(ctx, c, cmd, bytes.NewReader(in))
}

// runStream is run with its stdin read from in.
func runStream(ctx context.Context, c *ssh.Client, cmd string, in io.Reader) ([]byte, error) {
	type result struct {
		out []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := runSession(c, cmd, in)
		done <- result{out, err}
	}()
	select {
	case r := <-done:
		return r.out, r.err
	case <-ctx.Done():
		c.Close()
		return nil, ctx.Err()
	}
}

// limitedBuffer is a bytes.Buffer that refuses to grow past max.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

var errTooMuchOutput = errors.New("remote command printed too much")

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > b.max {
		return 0, errTooMuchOutput
	}
	return b.Buffer.Write(p)
}

// runSession is runStream without its context.
func runSession(c *ssh.Client, cmd string, in io.Reader) ([]byte, error) {
	s, err := c.NewSession()
	if err != nil {
		return nil, err
	}
	defer s.Close()
	out, stderr := &limitedBuffer{max: maxCommandOutput}, &limitedBuffer{max: 64 << 10}
	s.Stdout, s.Stderr = out, stderr
	s.Stdin = in
	if err := s.Run(cmd); err != nil {
		var ee *ssh.ExitError
		if errors.As(err, &ee) {
			msg := strings.TrimSpace(stderr.String())
			if len(msg) > 300 {
				msg = msg[:300] + "…"
			}
			return out.Bytes(), &exitError{cmd: cmd, status: ee.ExitStatus(), stderr: msg}
		}
		return nil, err
	}
	return out.Bytes(), nil
}

// exitError is a remote command that ran and exited non-zero.
type exitError struct {
	cmd    string
	status int
	stderr string
}

func (e *exitError) Error() string {
	cmd := e.cmd
	if len(cmd) > 200 {
		cmd = cmd[:200] + "…"
	}
	return fmt.Sprintf("remote %q exited %d: %s", cmd, e.status, e.stderr)
}

// parseDigest reads the 64 hex digits a hash tool prints first (any case).
func parseDigest(line []byte) (digest.Digest, bool) {
	f := strings.Fields(string(line))
	if len(f) == 0 {
		return "", false
	}
	h := strings.ToLower(strings.TrimPrefix(f[0], "\\")) // sha256sum escapes odd names with a leading \
	d, err := digest.FromHex(h)
	return d, err == nil
}

// rangeProbe is what the tool probe pipes through dd: the command must
// pass on its second byte alone, whose sha256 is rangeProbeSHA256.
const (
	rangeProbe       = "abc"
	rangeProbeSHA256 = "3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d" // sha256("b")
)

// probeScript asks the remote shell, in one command, for the first sha256
// tool that hashes an empty stdin right (the others are not run: shasum
// is a Perl script, slow to start), whether dd piped into it hashes a
// block cut out of its input right (POSIX dd: GNU coreutils, BSD and
// macOS, busybox), whether sync -f makes one file system durable (GNU
// coreutils ≥ 8.24, busybox) and which stat prints mtimes.
func probeScript() string { return "/bin/sh -c " + shQuote(probeBody()) }

// probeBody is probeScript's shell code.
func probeBody() string {
	var b strings.Builder
	b.WriteString("for c in")
	for _, c := range hashCommands {
		b.WriteString(" " + shQuote(c))
	}
	b.WriteString("; do case \"$(printf '' | $c 2>/dev/null)\" in " + emptySHA256 + "*) printf 'hash %s\\n' \"$c\"; ")
	b.WriteString("printf 'range %s\\n' \"$(printf " + rangeProbe + " | dd bs=1 skip=1 count=1 2>/dev/null | $c 2>/dev/null)\"; break;; esac; done; ")
	// /dev/null: sync -f of the working directory would flush whatever
	// that file system holds dirty (seconds after a big write there).
	b.WriteString("sync -f /dev/null >/dev/null 2>&1 && echo syncfs; ")
	b.WriteString("if stat -c %Y . >/dev/null 2>&1; then echo gnustat; elif stat -f %m . >/dev/null 2>&1; then echo bsdstat; fi; echo end")
	return b.String()
}

// probeAndListScript is probeScript and listScript in one command, the
// probe's answer first, then "ferry-probed", then the listing's.
func probeAndListScript(dir string, roots []string) string {
	return "/bin/sh -c " + shQuote(probeBody()+"; echo ferry-probed; "+listBody(dir, roots))
}

// probedMark ends the probe's answer in probeAndListScript's.
const probedMark = "ferry-probed\n"

// parseProbe reads probeScript's answer.
func parseProbe(out []byte) (*remoteTools, error) {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) == 0 || lines[len(lines)-1] != "end" {
		return nil, fmt.Errorf("the remote shell did not run the tool probe: %q", firstLine(out))
	}
	t := &remoteTools{}
	for _, l := range lines {
		if c, ok := strings.CutPrefix(l, "hash "); ok && slices.Contains(hashCommands, c) {
			t.hashCmd = c
		}
		if r, ok := strings.CutPrefix(l, "range "); ok && t.hashCmd != "" {
			d, ok := parseDigest([]byte(r))
			t.ranges = ok && d.Hex() == rangeProbeSHA256
		}
		switch l {
		case "syncfs":
			t.syncfs = true
		case "gnustat":
			t.stat = "stat -c %Y"
		case "bsdstat":
			t.stat = "stat -f %m"
		}
	}
	return t, nil
}

// rangeCommand is the remote command that hashes chunk i (of size cs) of
// the file p: dd reads that one block (a regular file returns whole
// blocks; the last may be short) into hashCmd.
func rangeCommand(hashCmd, p string, cs int64, i int) string {
	return fmt.Sprintf("dd if=%s bs=%d skip=%d count=1 2>/dev/null | %s", shellQuote(p), cs, i, hashCmd)
}

// hashListCommand hashes the files rels (relative to dir) in one command,
// after pre (a command run first in dir, or "") and after making dir's
// file system durable where sync says so, then prints their mtimes where
// the tools have a stat.
func hashListCommand(t *remoteTools, dir, pre string, rels []string) string {
	var b, files strings.Builder
	for _, r := range rels {
		files.WriteString(" " + shellQuote(r))
	}
	b.WriteString("cd " + shellQuote(dir) + " && ")
	if pre != "" {
		b.WriteString(pre + " && ")
	}
	if t.syncfs {
		b.WriteString("sync -f . && ")
	}
	b.WriteString(t.hashCmd + files.String())
	if t.stat != "" {
		b.WriteString(" && " + t.stat + files.String())
	}
	return b.String()
}

// parseHashList reads one digest a line for n files, then, with mtimes,
// one mtime a line.
func parseHashList(out []byte, n int, mtimes bool) ([]digest.Digest, []int64, error) {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	want := n
	if mtimes {
		want = 2 * n
	}
	if len(lines) != want {
		return nil, nil, fmt.Errorf("the remote hash command printed %d lines for %d files: %q", len(lines), n, firstLine(out))
	}
	ds := make([]digest.Digest, n)
	for i, l := range lines[:n] {
		d, ok := parseDigest([]byte(l))
		if !ok {
			return nil, nil, fmt.Errorf("the remote hash command printed no sha256: %q", firstLine([]byte(l)))
		}
		ds[i] = d
	}
	if !mtimes {
		return ds, nil, nil
	}
	ts := make([]int64, n)
	for i, l := range lines[n:] {
		t, err := strconv.ParseInt(strings.TrimSpace(l), 10, 64)
		if err != nil {
			return nil, nil, fmt.Errorf("the remote stat printed %q for an mtime", firstLine([]byte(l)))
		}
		ts[i] = t
	}
	return ds, ts, nil
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// entry is one path at a destination, as a listing found it.
type entry struct {
	kind   byte  // 'f' regular file, 'd' directory, 'l' symlink, '?' other
	size   int64 // bytes
	alloc  int64 // bytes allocated on disk (-1: unknown)
	mtime  int64 // unix seconds
	target string
}

// listScript lists, in one command, every path under the roots (names
// relative to dir): type, size, allocated 512-byte blocks and mtime. GNU
// find prints records ended by NUL; elsewhere (BSD, macOS) find runs stat,
// one line each. It answers "ferry-nodir" when dir is not a directory it
// can enter, "ferry-none" when neither tool works, and ends with
// "ferry-end" so that a cut answer is not taken for a short listing.
func listScript(dir string, roots []string) string {
	return "/bin/sh -c " + shQuote(listBody(dir, roots))
}

// listBody is listScript's shell code.
func listBody(dir string, roots []string) string {
	var r strings.Builder
	for _, x := range roots {
		r.WriteString(" " + shellQuote(x))
	}
	s := "cd " + shellQuote(dir) + " 2>/dev/null || { echo ferry-nodir; exit 0; }; " +
		"if find . -maxdepth 0 -printf '' >/dev/null 2>&1; then echo ferry-gnu; find" + r.String() + " -printf '%y %s %b %T@ %p\\0' 2>/dev/null; " +
		"elif stat -f %z . >/dev/null 2>&1; then echo ferry-bsd; find" + r.String() + " -exec stat -f '%Sp %z %b %m %N' {} + 2>/dev/null; " +
		"else echo ferry-none; fi; echo; echo ferry-end"
	return s
}

// errNoListing is a remote shell that cannot list (neither GNU find nor
// BSD stat): the listing is then made over SFTP.
var errNoListing = errors.New("no listing tool on the remote host")

// errNoDir is a destination directory that does not exist yet.
var errNoDir = errors.New("destination directory does not exist")

// parseListing reads listScript's answer into paths relative to dir.
func parseListing(out []byte) (map[string]entry, error) {
	end := bytes.LastIndex(out, []byte("\nferry-end"))
	if end < 0 {
		return nil, fmt.Errorf("the remote listing was cut short: %q", firstLine(out))
	}
	body := out[:end]
	mode, rest, _ := bytes.Cut(body, []byte("\n"))
	switch string(mode) {
	case "ferry-nodir":
		return nil, errNoDir
	case "ferry-none":
		return nil, errNoListing
	case "ferry-gnu", "ferry-bsd":
	default:
		return nil, fmt.Errorf("the remote listing answered %q", firstLine(out))
	}
	sep := byte('\n')
	if string(mode) == "ferry-gnu" {
		sep = 0
	}
	m := map[string]entry{}
	for rec := range bytes.SplitSeq(rest, []byte{sep}) {
		if len(rec) == 0 {
			continue
		}
		f := strings.SplitN(string(rec), " ", 5)
		if len(f) != 5 {
			return nil, fmt.Errorf("the remote listing has a line of %d fields: %q", len(f), rec)
		}
		var e entry
		var err error
		switch string(mode) {
		case "ferry-gnu":
			e.kind = f[0][0]
		default: // a permission string: -rw-r--r--
			e.kind = map[byte]byte{'-': 'f', 'd': 'd', 'l': 'l'}[f[0][0]]
		}
		if e.kind == 0 {
			e.kind = '?'
		}
		if e.size, err = strconv.ParseInt(f[1], 10, 64); err != nil {
			return nil, fmt.Errorf("the remote listing has a bad size: %q", rec)
		}
		blocks, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("the remote listing has a bad block count: %q", rec)
		}
		e.alloc = blocks * 512
		sec, _, _ := strings.Cut(f[3], ".")
		if e.mtime, err = strconv.ParseInt(sec, 10, 64); err != nil {
			return nil, fmt.Errorf("the remote listing has a bad mtime: %q", rec)
		}
		p := strings.TrimPrefix(f[4], "./")
		m[p] = e
	}
	return m, nil
}
