// Package digest is ferry's one content address: a sha256 written
// "sha256:<64 lowercase hex>", the form the store names blobs by and every
// report prints. Code that has a raw sum or a bare hex string turns it into
// a Digest here (New, FromHex) instead of gluing the prefix on itself.
package digest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Digest is a sha256 content address, "sha256:<64 lowercase hex>". It
// marshals as that string.
type Digest string

// Algorithm is the only digest algorithm ferry uses.
const Algorithm = "sha256"

const prefix = Algorithm + ":"

// ErrBad reports a string that is not "sha256:<64 lowercase hex>".
var ErrBad = errors.New("manifest: malformed digest")

// New makes a Digest from a raw sha256 sum.
func New(sum []byte) Digest { return Digest(prefix + hex.EncodeToString(sum)) }

// Of hashes b.
func Of(b []byte) Digest {
	s := sha256.Sum256(b)
	return New(s[:])
}

// Parse checks s, "sha256:<hex>", and returns it as a Digest.
func Parse(s string) (Digest, error) {
	d := Digest(s)
	if err := d.Validate(); err != nil {
		return "", err
	}
	return d, nil
}

// FromHex makes a Digest from its 64-character lowercase hex part (a blob's
// file name, a sha256 column).
func FromHex(h string) (Digest, error) { return Parse(prefix + h) }

// Validate reports whether d is well formed.
func (d Digest) Validate() error {
	h, ok := strings.CutPrefix(string(d), prefix)
	if !ok || len(h) != 2*sha256.Size {
		return fmt.Errorf("%w: %q", ErrBad, string(d))
	}
	for _, c := range h {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return fmt.Errorf("%w: %q", ErrBad, string(d))
		}
	}
	return nil
}

// Hex is the 64-character hex part.
func (d Digest) Hex() string { return strings.TrimPrefix(string(d), prefix) }

// Short is a 12-character prefix of the hex, for humans.
func (d Digest) Short() string {
	h := d.Hex()
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

func (d Digest) String() string { return string(d) }

// ReadSums reads a sha256sum listing (SHA256SUMS: "<hex>  <name>" lines,
// a '*' before the name for binary mode) into name → digest. The reference
// sets' SHA256SUMS files are what golden tests compare outputs with.
func ReadSums(path string) (map[string]Digest, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	sums := map[string]Digest{}
	for i, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		d, err := FromHex(f[0])
		if len(f) != 2 || err != nil {
			return nil, fmt.Errorf("%s:%d: not a sha256sum line: %q", path, i+1, line)
		}
		sums[strings.TrimPrefix(f[1], "*")] = d
	}
	return sums, nil
}
