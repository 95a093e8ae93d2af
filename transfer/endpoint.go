package transfer

import (
	"context"
	"io/fs"
	"strings"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/progress"
	"github.com/ferry-llm/ferry/internal/s3client"
)

// endpoint is what the fan-out core asks of one destination. Paths are
// relative to the destination directory; a file is written to REL.partial
// and renamed to REL once verified. Three kinds implement it: sftpDest (a
// directory on an SSH host: sftp.go, sftpops.go), localDest (a directory
// on this machine, a disk or a mount: local.go) and s3Dest (a prefix in an
// S3 bucket, where the partial is a multipart upload: s3dest.go). Slots and
// connection numbers are the core's way of spreading work; an endpoint
// with no sessions ignores them.
type endpoint interface {
	// where names the destination directory in messages; remote names
	// rel there.
	where() string
	remote(rel string) string

	// watch closes what makes no progress until stop; closeAll ends
	// every connection. counts are the requests and commands the run
	// made (the report's round trips).
	watch(ctx context.Context, stop <-chan struct{})
	closeAll()
	counts() (requests, commands int64)
	slotOf(k int) int
	metaSlot(k int) int

	// list returns what the destination holds under roots (and whether
	// its directory is missing); with probe, it learns the verifier too.
	list(ctx context.Context, roots, dirs []string, probe bool) (map[string]entry, bool, error)
	// probeTools says how written files are verified there.
	probeTools(ctx context.Context) (*remoteTools, error)
	mkdirs(ctx context.Context, dirs []string, m map[string]entry, top bool) error
	space(ctx context.Context) (free int64, known bool, err error)

	// putSmall writes a whole file whose bytes, data, the core checked
	// to be the plan's (their sha256 is the File's Digest).
	putSmall(ctx context.Context, slot int, rel string, data []byte, sync bool, prog progress.Reporter) error
	createPartial(ctx context.Context, slot int, rel string, size int64) error
	// writeChunk and rewriteChunk write a chunk; sum gives its sha256
	// (computed once for every destination: call it only where needed).
	writeChunk(ctx context.Context, slot int, rel string, off int64, data []byte, sum func() digest.Digest, prog progress.Reporter) error
	closePartial(rel string)
	rewriteChunk(ctx context.Context, slot int, rel string, off int64, data []byte, sum func() digest.Digest) error

	// hashFiles verifies many written files at once (durable first) and
	// gives their mtimes where known; rangeHash hashes one chunk there.
	hashFiles(ctx context.Context, conn int, t *remoteTools, rels []string, n int64) ([]digest.Digest, []int64, error)
	rangeHash(ctx context.Context, conn int, t *remoteTools, rel string, cs int64, i int, retry bool) (digest.Digest, error)
	// readBack and readBackChunk read what is there through the write
	// path's own channel: the fallback, and the check of a verifier that
	// disagrees.
	readBack(ctx context.Context, slot int, p string, size, cs int64) (digest.Digest, []digest.Digest, error)
	readBackChunk(ctx context.Context, slot int, rel string, size, cs int64, i int) (digest.Digest, error)

	commit(ctx context.Context, slot int, rel string, perm fs.FileMode, modeSet, stat bool) (mtime int64, err error)
	symlink(ctx context.Context, slot int, rel, target string, e entry) error
	remove(ctx context.Context, slot int, rel string, dir bool) error
	// flush makes what the run renamed durable (once, at its end).
	flush(ctx context.Context) error
}

// restamper is an endpoint that learns only at the end of a run the
// exact mtimes of files it committed (an object store, whose put answers
// no Last-Modified): the record of what was verified takes them, so that
// the next run trusts those files by their listing.
type restamper interface {
	restamp(ctx context.Context) map[string]int64
}

var _ restamper = (*s3Dest)(nil)

// An S3 upload carries the file's sha256 from its start (the object's
// metadata is given when the upload is created).
func (s *s3Dest) digestsFirst() {}

var _ digestsFirst = (*s3Dest)(nil)

var (
	_ endpoint = (*sftpDest)(nil)
	_ endpoint = (*localDest)(nil)
	_ endpoint = (*s3Dest)(nil)
)

func (s *sftpDest) where() string { return s.dir }

// flush: an SFTP rename is as durable as the server makes it.
func (s *sftpDest) flush(context.Context) error { return nil }

func (s *sftpDest) counts() (int64, int64) { return s.requests.Load(), s.commands.Load() }

// newEndpoint makes the endpoint of destination d, which receives p.
func newEndpoint(d Destination, o *Options, p *Plan) endpoint {
	switch {
	case d.S3:
		return newS3Dest(d, o, p)
	case d.Local:
		return newLocalDest(d, o)
	}
	return newSFTPDest(d, o)
}

// IsS3 says whether a destination argument names a prefix in an S3 bucket
// ("s3://BUCKET/PREFIX").
func IsS3(arg string) bool { return s3client.IsURL(arg) }

// LocalDir says whether a destination argument names a directory on this
// machine, telling the two apart as rsync does: "file:///PATH", or a path
// with no colon before its first slash ("/mnt/models/x", "./out", "out",
// "~/m"); anything else is [user@]HOST:DIR. A local name with a colon in
// its first element is written "./a:b". The path is returned as given
// (file:// removed); the caller makes it absolute.
func LocalDir(arg string) (string, bool) {
	if IsS3(arg) {
		return arg, false
	}
	if rest, ok := strings.CutPrefix(arg, "file://"); ok {
		return rest, true
	}
	colon := strings.IndexByte(arg, ':')
	slash := strings.IndexByte(arg, '/')
	return arg, colon < 0 || (slash >= 0 && slash < colon)
}
