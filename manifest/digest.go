// Package manifest is ferry's content-addressed store: blobs named by their
// sha256 under <store>/blobs/sha256/<hex>, stage records in manifest.json,
// views (directories of relative symlinks into the blobs, the layout the
// Hugging Face cache uses), resume journals for big single-file outputs, and
// the store lock.
//
// Ordering invariants (restic's): a blob is durable (fsynced, renamed, its
// directory fsynced) before any record refers to it; manifest.json is
// rewritten atomically and last, and is the commit point of a stage. Garbage
// (unreferenced blobs, temp files, journals) is allowed and removed by GC;
// dangling references are not.
package manifest

import "github.com/ferry-llm/ferry/internal/digest"

// Digest is the store's content address, internal/digest's one Digest type:
// "sha256:<64 lowercase hex>".
type Digest = digest.Digest

// Algorithm is the only digest algorithm the store uses.
const Algorithm = digest.Algorithm

// ErrBadDigest reports a digest string that is not "sha256:<64 hex>".
var ErrBadDigest = digest.ErrBad

// NewDigest makes a Digest from a raw sha256 sum.
func NewDigest(sum []byte) Digest { return digest.New(sum) }

// DigestOf hashes b.
func DigestOf(b []byte) Digest { return digest.Of(b) }

// ParseDigest checks s and returns it as a Digest.
func ParseDigest(s string) (Digest, error) { return digest.Parse(s) }
