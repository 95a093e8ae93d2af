package transfer

import (
	"fmt"
	"strings"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/errkind"
)

// Report is the result of Run: what each destination holds now, verified,
// and what this run sent to it. `ferry transfer --json` prints it and the
// pipeline stage stores it.
type Report struct {
	Files int          `json:"files"` // files in the plan
	Bytes int64        `json:"bytes"` // their total size
	Hosts []HostReport `json:"hosts"`
}

// HostReport is one destination.
type HostReport struct {
	Destination string       `json:"destination"` // as given ([user@]host:dir)
	Host        string       `json:"host"`
	Dir         string       `json:"dir"`
	OK          bool         `json:"ok"`
	Error       string       `json:"error,omitempty"`
	HashCommand string       `json:"hash_command,omitempty"` // remote tool that verified, or "read-back"
	Bytes       int64        `json:"bytes"`                  // bytes of the files verified there
	Sent        int64        `json:"sent"`                   // bytes written by this run (chunks, repairs)
	Seconds     float64      `json:"seconds"`
	MBps        float64      `json:"mb_per_s"` // Sent / Seconds, in 10⁶ bytes per second
	Files       []FileReport `json:"files"`
	Links       []string     `json:"links,omitempty"` // links made or found right
	// Extra is what the destination holds under the plan's directories
	// that the plan does not (files it did not put there), deepest first;
	// Deleted, what of it this run removed (Options.DeleteExtra).
	Extra   []string `json:"extra,omitempty"`
	Deleted []string `json:"deleted,omitempty"`
	// Requests and Commands are the SFTP requests and remote commands this
	// run made: each is a round trip (most of them made many at once).
	Requests int64 `json:"sftp_requests"`
	Commands int64 `json:"remote_commands"`
}

// FileReport is one file at one destination.
type FileReport struct {
	Path     string        `json:"path"` // relative to the destination directory
	Size     int64         `json:"size"`
	Digest   digest.Digest `json:"digest"`
	Verified bool          `json:"verified"`          // the remote file has Digest
	Skipped  bool          `json:"skipped,omitempty"` // it was there already
	Trusted  bool          `json:"trusted,omitempty"` // as an earlier run verified and left it (size and mtime), not read again
	Resumed  bool          `json:"resumed,omitempty"` // chunks of an earlier run were kept
	Sent     int64         `json:"sent"`              // bytes written by this run
	Chunks   int           `json:"chunks_sent"`       // chunks written by this run
	Repaired int           `json:"chunks_repaired,omitempty"`
	Seconds  float64       `json:"seconds"`
	MBps     float64       `json:"mb_per_s"`
	Error    string        `json:"error,omitempty"`
}

// HostError is a destination that failed, with the file it failed on.
type HostError struct {
	Dest string // the destination as given
	File string // relative path, "" when the failure is not about one file
	Err  error
}

func (e *HostError) Error() string {
	if e.File != "" {
		return fmt.Sprintf("%s: %s: %v", e.Dest, e.File, e.Err)
	}
	return fmt.Sprintf("%s: %v", e.Dest, e.Err)
}

func (e *HostError) Unwrap() error { return e.Err }

// Kind is the kind of the underlying error.
func (e *HostError) Kind() errkind.Kind { return errkind.Of(e.Err) }

// FailedError is what Run returns when some destinations failed: the
// others finished (their reports say so).
type FailedError struct {
	Hosts  []*HostError
	Of     int // destinations in the run
	Failed []string
}

func (e *FailedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "transfer failed on %d of %d destinations (%s)", len(e.Hosts), e.Of, strings.Join(e.Failed, ", "))
	for _, h := range e.Hosts {
		b.WriteString("\n  ")
		b.WriteString(h.Error())
	}
	return b.String()
}

// Unwrap gives errors.Is and errors.As every host's error.
func (e *FailedError) Unwrap() []error {
	out := make([]error, len(e.Hosts))
	for i, h := range e.Hosts {
		out[i] = h
	}
	return out
}

// Kind is the kind the failures share: Interrupted if any was cancelled,
// else their common kind, else Failure.
func (e *FailedError) Kind() errkind.Kind {
	k := errkind.Of(e.Hosts[0])
	for _, h := range e.Hosts {
		hk := errkind.Of(h)
		if hk == errkind.Interrupted {
			return hk
		}
		if hk != k {
			k = errkind.Failure
		}
	}
	return k
}
