package transfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/pkg/sftp"

	"github.com/ferry-llm/ferry/internal/errkind"
)

// errStalled marks an operation whose connection was closed for making no
// progress.
var errStalled = errkind.New(errkind.Retryable, "connection stalled")

// ErrRemoteFull is wrapped by errors about a destination file system
// without room for what is sent.
var ErrRemoteFull = errors.New("remote file system full")

// ErrRemoteHash is wrapped when the remote hash tool reports a digest that
// the file's bytes, read back, contradict.
var ErrRemoteHash = errkind.New(errkind.VerifyFailed, "the remote hash command reports a wrong digest")

// ErrVerify is wrapped when a remote file keeps differing from the source
// after its bad chunks were sent again.
var ErrVerify = errkind.New(errkind.VerifyFailed, "remote file does not match")

// ErrInterrupted is what a destination reports when the run was
// cancelled (Ctrl-C, SIGTERM) before it finished: what it verified stays,
// and the next run sends only the rest.
var ErrInterrupted = errkind.New(errkind.Interrupted, "interrupted")

// retryable reports errors that a new connection may cure. The kind
// decides: an error that knows its kind (a refused host key or login, a
// stall) says so itself; errors of the transport, which know no kind, are
// recognised by their type, never by their text.
func retryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
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
	return errors.As(err, &ne)
}

// deadOr marks err retryable when the connection it happened on is gone
// (or goes within a moment: the error can arrive first): whatever the
// error says, a new connection may cure it.
func deadOr(dead <-chan struct{}, err error) error {
	if retryable(err) {
		return err
	}
	select {
	case <-dead:
	case <-time.After(100 * time.Millisecond):
		return err
	}
	return errkind.Mark(errkind.Retryable, fmt.Errorf("connection lost: %w", err))
}

// statusCode is the SFTP status code of err (0 when err is not an SFTP
// status).
func statusCode(err error) uint32 {
	var se *sftp.StatusError
	if errors.As(err, &se) {
		return se.Code
	}
	return 0
}

// sshFxFailure is SSH_FX_FAILURE, the status OpenSSH's sftp-server
// answers for errno values SFTP v3 has no code for (ENOSPC among them).
const sshFxFailure = 4
