package transfer

import (
	"context"
	"log/slog"
	"time"

	"golang.org/x/crypto/ssh"

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
	// Local says Dir is a directory on this machine (a disk, a mount):
	// written directly, verified by reading it again, no Dial, no
	// PreFlight.
	Local bool
	// S3 says Dir is "s3://BUCKET/PREFIX": objects under the prefix,
	// written by puts and multipart uploads with their SHA-256, no Dial,
	// no PreFlight. Settings are read as every S3 tool reads them
	// (AWS_ENDPOINT_URL_S3, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_PROFILE …).
	S3 bool
}

// Options tune Run.
type Options struct {
	// Streams is the number of SSH connections per destination (default
	// 4), each carrying SessionsPerConn SFTP sessions that write chunks at
	// their offsets. One SSH channel moves at most its 2 MiB window per
	// round trip, so on a 40 ms link more channels and connections, not
	// bigger packets, are what makes a copy fast. Connections are opened
	// when there is something to send on them: a run with nothing to send
	// opens one.
	Streams int
	// Sessions is the number of SFTP sessions (SSH channels) on each
	// stream's connection (default SessionsPerConn). Each moves at most
	// its window per round trip and idles while the last writes of a
	// chunk and its fsync are acknowledged; more of them keep more bytes
	// in flight.
	Sessions int
	// StateDir holds the resume journals and the record of what each
	// destination was verified to hold, one of each per destination, and
	// the digest cache of the sources (required).
	StateDir string
	// IndexDir, if set, holds the record of what each destination was
	// verified to hold instead of StateDir: one that outlives a state
	// directory kept only for a run's resume.
	IndexDir string
	// MaxPacket is the SFTP write size; 0 picks the largest the server
	// allows (255 KiB where it advertises limits@openssh.com, as every
	// OpenSSH since 8.7 does; else the 32 KiB every server must take).
	MaxPacket int
	// Verify re-hashes remote files that an earlier run verified, instead
	// of trusting their size and modification time.
	Verify bool
	// DeleteExtra removes what the destination holds under the plan's
	// directories that the plan does not (as rsync --delete does).
	// Without it such files are only reported (HostReport.Extra).
	DeleteExtra bool
	// InFlight bounds the bytes of source data held at once: read, and not
	// yet written to every destination that needs them (default: a chunk
	// per session and one more). Many small files are in flight at once
	// within it.
	InFlight int64
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
	// (route and interface checks), once per host however many
	// destinations are on it; its error fails those destinations.
	PreFlight func(ctx context.Context, d Destination) error
	Log       *slog.Logger
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

// maxExecPerConn bounds the remote commands running at once on one SSH
// connection beside its SFTP sessions: OpenSSH's MaxSessions is 10 by
// default, and a channel over it is refused.
const maxExecPerConn = 10

func (o *Options) defaults(chunkSize int64) {
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
	if o.InFlight <= 0 {
		o.InFlight = int64(o.Streams*o.Sessions+1) * chunkSize
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
}
