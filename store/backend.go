// Package store is ferry's content-addressed store on any storage that can
// do conditional writes: a local directory or an S3 bucket shared by many
// machines. Its semantics are written once, here, over a small Backend
// (what storage must do: head, read, conditional put, resumable multipart
// upload, list, delete); each backend is one package (store/local,
// store/s3) and passes one conformance suite (store/storetest).
//
// Objects, under the backend's root (a directory, or s3://BUCKET/PREFIX):
//
//	format                  the layout version, written create-only at first open
//	blobs/sha256/<hex>      blobs, write-once, named by their SHA-256
//	records/<key>.json      stage records: immutable, the commit point of a stage
//	refs/<name>             mutable pointers, changed by compare-and-swap only
//	leases/<name>           leases (a stage being made), taken create-only
//	probe/<nonce>           the conditional-write probe's scratch objects
//
// Nothing in an object names a path, an inode, a PID or the binary's
// version: a second machine or a later release reads it alike.
package store

import (
	"context"
	"errors"
	"time"

	"github.com/ferry-llm/ferry/internal/errkind"
)

// Backend is what the store needs from storage. Keys are slash-separated
// and relative to the backend's root. Every method is safe for concurrent
// use, by goroutines and by processes on other machines: the conditions
// are checked by the storage, atomically.
type Backend interface {
	// String names the store for messages: "s3://bucket/prefix", "/dir".
	String() string
	// Head returns what the storage knows of key, or ErrNotFound.
	Head(ctx context.Context, key string) (Info, error)
	// Get reads key whole; an object over max bytes is an error.
	Get(ctx context.Context, key string, max int64) ([]byte, Info, error)
	// GetRange fills buf with the bytes of key at off; fewer bytes than
	// len(buf) is an error (io.ErrUnexpectedEOF).
	GetRange(ctx context.Context, key string, off int64, buf []byte) error
	// Put writes body as key under opt's conditions: ErrPrecondition when
	// they do not hold (nothing is written), ErrBadDigest when body's
	// SHA-256 is not opt.SHA256 (nothing is written).
	Put(ctx context.Context, key string, body []byte, opt PutOptions) (Info, error)
	// Delete removes key; with ifMatch set, only while its ETag is ifMatch
	// (ErrPrecondition otherwise; where the storage ignores the condition,
	// the probe says so). Deleting a missing key is not an error without
	// ifMatch; with it, ErrNotFound or ErrPrecondition.
	Delete(ctx context.Context, key, ifMatch string) error
	// List calls fn for every key under prefix, in key order.
	List(ctx context.Context, prefix string, fn func(Info) error) error

	// CreateUpload starts a multipart upload of key and returns its id.
	CreateUpload(ctx context.Context, key string) (string, error)
	// UploadPart stores part n (1-based) of upload id; the storage
	// rejects a body whose SHA-256 is not sum (ErrBadDigest), and
	// ErrNoUpload means the upload is gone (completed or aborted).
	UploadPart(ctx context.Context, key, id string, n int, body []byte, sum [32]byte) (Part, error)
	// ListParts returns the parts the storage holds durably, in order.
	ListParts(ctx context.Context, key, id string) ([]Part, error)
	// CompleteUpload joins parts into key under opt's conditions
	// (opt.SHA256 is not used: a multipart object's checksum is the
	// storage's checksum of part checksums).
	CompleteUpload(ctx context.Context, key, id string, parts []Part, opt PutOptions) (Info, error)
	// AbortUpload drops upload id and its parts.
	AbortUpload(ctx context.Context, key, id string) error
	// ListUploads calls fn for every unfinished upload under prefix.
	ListUploads(ctx context.Context, prefix string, fn func(Upload) error) error
}

// Optional fast paths a backend may offer, found by type assertion; the
// store falls back to the Backend methods without them.

// FilePutter stores a file as key, create-only, more cheaply than by
// reading it into parts (store/local: a reflink clone or an in-kernel
// copy). The bytes stored must hash to sum: ErrBadDigest otherwise, and
// nothing is stored.
type FilePutter interface {
	PutFile(ctx context.Context, key, path string, sum [32]byte) (Info, error)
}

// FileGetter copies key into the new file dst (a clone where it can);
// the store verifies what it wrote before anything reads it.
type FileGetter interface {
	GetFile(ctx context.Context, key, dst string) error
}

// DateGrain is offered by a backend whose dates (Info.Modified, Info.Date)
// are coarse: S3's have whole seconds. A lease's age is judged from them,
// so its ttl must be at least MinLeaseTTLGrains of this grain (see
// Lease.renew).
type DateGrain interface {
	DateGrain() time.Duration
}

// MinLeaseTTLGrains is how many of its storage's date grains a lease's ttl
// must span at least.
const MinLeaseTTLGrains = 3

// LocalFiler is offered by a backend whose objects are files on this
// machine (store/local): Copy stores a blob from its file.
type LocalFiler interface {
	// LocalFile is key's file; ErrNotFound when there is none.
	LocalFile(key string) (string, error)
}

// FileAdopter is offered by a backend on this machine's file systems
// (store/local): a file written in its TempDir becomes an object by a
// link, not a copy.
type FileAdopter interface {
	// TempDir is a directory on the storage's file system for such files.
	TempDir() (string, error)
	// AdoptFile makes the file at path (in TempDir, its bytes checked by
	// the caller: a fetched blob's digest) the object key, create-only:
	// ErrPrecondition when key exists. The file stays at path too.
	AdoptFile(ctx context.Context, key, path string) (Info, error)
}

// TempKeeper is offered by a backend that keeps temp files of its own on
// this machine's file systems (store/local): what a put, or a copy
// fetching a blob through its TempDir, cut short by a kill left behind.
// du counts them and gc removes the old ones.
type TempKeeper interface {
	// Temp counts the temp files and, with remove, removes those last
	// written more than olderThan ago (by this machine's clock) that no
	// live process holds; without remove it counts those it would.
	Temp(ctx context.Context, olderThan time.Duration, remove bool) (TempReport, error)
}

// TempReport is what TempKeeper.Temp found.
type TempReport struct {
	Files        int   `json:"files"`
	Bytes        int64 `json:"bytes"`
	Removed      int   `json:"removed"` // or, without remove, would be
	RemovedBytes int64 `json:"removed_bytes"`
}

// Info is what the storage says of an object.
type Info struct {
	Key      string
	Size     int64
	ETag     string    // opaque; what PutOptions.IfMatch takes
	Modified time.Time // when the object was last written, by the storage's clock
	// Date is the storage's clock when it answered (an HTTP Date header):
	// Date - Modified is an object's age, judged by one clock whatever the
	// clocks of the machines that share the storage say.
	Date time.Time
}

// PutOptions are the conditions of a write.
type PutOptions struct {
	// IfNoneMatch: create only; ErrPrecondition when key exists.
	IfNoneMatch bool
	// IfMatch: replace only the object whose ETag this is;
	// ErrPrecondition when key holds anything else or nothing.
	IfMatch string
	// SHA256 is the body's digest; the storage rejects a body that does
	// not match it (ErrBadDigest). Put computes it when nil.
	SHA256 *[32]byte
}

// Part is one durable part of a multipart upload.
type Part struct {
	Number int
	Size   int64
	SHA256 [32]byte
	ETag   string
}

// Upload is an unfinished multipart upload.
type Upload struct {
	Key       string
	ID        string
	Initiated time.Time
}

// The conditions a backend reports. A backend wraps them with what the
// storage said; errors.Is finds them.
var (
	// ErrNotFound: no such object.
	ErrNotFound = errors.New("store: no such object")
	// ErrPrecondition: a write's condition did not hold (HTTP 412).
	ErrPrecondition = errors.New("store: precondition failed")
	// ErrBadDigest: the storage refused a body that did not match the
	// SHA-256 it was sent with; nothing was written.
	ErrBadDigest = errkind.New(errkind.Retryable, "store: body does not match its SHA-256")
	// ErrNoUpload: the multipart upload is gone (completed or aborted).
	ErrNoUpload = errors.New("store: no such upload")
	// ErrTooLarge: an object over the limit Get was given.
	ErrTooLarge = errors.New("store: object too large")
)

// MaxParts is the most parts one multipart upload may have (S3's limit);
// MinPartSize is the smallest part but the last.
const (
	MaxParts    = 10000
	MinPartSize = 5 << 20
)

// OnThisMachine is a Backend whose server may run on this machine (an S3
// gateway on a loopback address): its requests then spend this machine's
// CPU, which Options.Cores hands out.
type OnThisMachine interface {
	OnThisMachine() bool
}

// onThisMachine says whether b's server runs on this machine.
func onThisMachine(b Backend) bool {
	o, ok := b.(OnThisMachine)
	return ok && o.OnThisMachine()
}
