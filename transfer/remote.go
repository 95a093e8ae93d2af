package transfer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/ferry-llm/ferry/internal/digest"
)

// hashCommands are the remote sha256 tools tried in order, each followed
// by a quoted path and printing the digest as its first field. openssl
// comes first because it is the fastest where it is there (OpenSSL and
// LibreSSL use the CPU's SHA extensions; Debian 12's coreutils sha256sum
// does not: 1560 vs 470 MB/s on one machine, see the transfer notes);
// sha256sum is GNU coreutils (Linux), shasum the Perl script macOS ships.
var hashCommands = []string{"openssl dgst -sha256 -r", "sha256sum", "shasum -a 256"}

// emptySHA256 is the sha256 of no bytes: each candidate is probed by
// hashing an empty stdin, so a tool that is missing, broken or not sha256
// is never used.
var emptySHA256 = func() string { s := sha256.Sum256(nil); return hex.EncodeToString(s[:]) }()

// ReadBack names the verification that reads the remote file back over
// SFTP and hashes it locally, used where no remote hash command works.
const ReadBack = "read-back"

// shellQuote quotes s for a POSIX shell: single quotes, each ' written as
// '\”. A relative path gets "./" in front so that no tool takes a name
// starting with "-" for an option.
func shellQuote(s string) string {
	if !strings.HasPrefix(s, "/") {
		s = "./" + s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// run runs cmd on the remote host with stdin from in and returns its
// stdout; stderr is added to the error. When ctx ends first, the
// connection is closed: opening the session or waiting for the command
// may hang on a connection that died under it (pkg/ssh takes no context),
// and the caller retries on a new one.
func run(ctx context.Context, c *ssh.Client, cmd string, in []byte) ([]byte, error) {
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

// runSession is run without its context.
func runSession(c *ssh.Client, cmd string, in []byte) ([]byte, error) {
	s, err := c.NewSession()
	if err != nil {
		return nil, err
	}
	defer s.Close()
	var out, stderr bytes.Buffer
	s.Stdout, s.Stderr = &out, &stderr
	s.Stdin = bytes.NewReader(in)
	if err := s.Run(cmd); err != nil {
		var ee *ssh.ExitError
		if errors.As(err, &ee) {
			msg := strings.TrimSpace(stderr.String())
			if len(msg) > 300 {
				msg = msg[:300] + "…"
			}
			return nil, fmt.Errorf("remote %q exited %d: %s", cmd, ee.ExitStatus(), msg)
		}
		return nil, err
	}
	return out.Bytes(), nil
}

// parseDigest reads the 64 hex digits a hash tool prints first (any case).
func parseDigest(out []byte) (string, bool) {
	f := strings.Fields(string(out))
	if len(f) == 0 {
		return "", false
	}
	h := strings.ToLower(strings.TrimPrefix(f[0], "\\")) // sha256sum escapes odd names with a leading \
	if _, err := digest.FromHex(h); err != nil {
		return "", false
	}
	return h, true
}

// detectHash returns the first hash command that hashes an empty stdin
// right on the remote host, or "" when none does (then files are verified
// by reading them back). An error is a transport error, not a missing
// tool.
func detectHash(ctx context.Context, c *ssh.Client) (string, error) {
	for _, cmd := range hashCommands {
		out, err := run(ctx, c, cmd, nil)
		if err != nil {
			if isTransient(err) || ctx.Err() != nil {
				return "", err
			}
			continue
		}
		if h, ok := parseDigest(out); ok && h == emptySHA256 {
			return cmd, nil
		}
	}
	return "", nil
}

// remoteHash runs hashCmd on the remote file p.
func remoteHash(ctx context.Context, c *ssh.Client, hashCmd, p string) (digest.Digest, error) {
	out, err := run(ctx, c, hashCmd+" "+shellQuote(p), nil)
	if err != nil {
		return "", err
	}
	h, ok := parseDigest(out)
	if !ok {
		return "", fmt.Errorf("remote %q printed no sha256: %q", hashCmd, firstLine(out))
	}
	return digest.FromHex(h)
}

// rangeProbe is what detectRange pipes through dd: the command must pass
// on its second byte alone, whose sha256 is rangeProbeSHA256.
const (
	rangeProbe       = "abc"
	rangeProbeSHA256 = "3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d" // sha256("b")
)

// detectRange says whether dd, piped into hashCmd, hashes a block cut out
// of its input right on the remote host (POSIX dd: GNU coreutils, BSD and
// macOS, busybox). A missing or odd dd makes the remote checks fall back
// to hashing whole files. An error is a transport error.
func detectRange(ctx context.Context, c *ssh.Client, hashCmd string) (bool, error) {
	out, err := run(ctx, c, "dd bs=1 skip=1 count=1 2>/dev/null | "+hashCmd, []byte(rangeProbe))
	if err != nil {
		if isTransient(err) || ctx.Err() != nil {
			return false, err
		}
		return false, nil
	}
	h, ok := parseDigest(out)
	return ok && h == rangeProbeSHA256, nil
}

// rangeCommand is the remote command that hashes chunk i (of size cs) of
// the file p: dd reads that one block (a regular file returns whole
// blocks; the last may be short) into hashCmd.
func rangeCommand(hashCmd, p string, cs int64, i int) string {
	return fmt.Sprintf("dd if=%s bs=%d skip=%d count=1 2>/dev/null | %s", shellQuote(p), cs, i, hashCmd)
}

// remoteRangeHash hashes chunk i of the remote file p on the remote host.
func remoteRangeHash(ctx context.Context, c *ssh.Client, hashCmd, p string, cs int64, i int) (digest.Digest, error) {
	cmd := rangeCommand(hashCmd, p, cs, i)
	out, err := run(ctx, c, cmd, nil)
	if err != nil {
		return "", err
	}
	h, ok := parseDigest(out)
	if !ok {
		return "", fmt.Errorf("remote %q printed no sha256: %q", cmd, firstLine(out))
	}
	return digest.FromHex(h)
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
