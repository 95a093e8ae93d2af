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

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Digest is a sha256 content address written "sha256:<64 lowercase hex>".
type Digest string

// Algorithm is the only digest algorithm the store uses.
const Algorithm = "sha256"

// ErrBadDigest reports a digest string that is not "sha256:<64 hex>".
var ErrBadDigest = errors.New("manifest: malformed digest")

// NewDigest makes a Digest from a raw sha256 sum.
func NewDigest(sum []byte) Digest {
	return Digest(Algorithm + ":" + hex.EncodeToString(sum))
}

// DigestOf hashes b.
func DigestOf(b []byte) Digest {
	s := sha256.Sum256(b)
	return NewDigest(s[:])
}

// ParseDigest checks s and returns it as a Digest.
func ParseDigest(s string) (Digest, error) {
	d := Digest(s)
	if err := d.Validate(); err != nil {
		return "", err
	}
	return d, nil
}

// Validate reports whether d is well formed.
func (d Digest) Validate() error {
	h, ok := strings.CutPrefix(string(d), Algorithm+":")
	if !ok || len(h) != 64 {
		return fmt.Errorf("%w: %q", ErrBadDigest, string(d))
	}
	for _, c := range h {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return fmt.Errorf("%w: %q", ErrBadDigest, string(d))
		}
	}
	return nil
}

// Hex is the 64-character hex part.
func (d Digest) Hex() string { return strings.TrimPrefix(string(d), Algorithm+":") }

// Short is a 12-character prefix of the hex, for humans.
func (d Digest) Short() string {
	h := d.Hex()
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

func (d Digest) String() string { return string(d) }
