package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Check is one point of the conditional-write probe.
type Check struct {
	Name     string `json:"name"`
	OK       bool   `json:"ok"`
	Required bool   `json:"required"` // sharing is refused when it fails
	Detail   string `json:"detail,omitempty"`
}

// ProbeReport is what Probe found.
type ProbeReport struct {
	Store  string  `json:"store"`
	Checks []Check `json:"checks"`
	// OK: every required check passed; the store may be shared.
	OK bool `json:"ok"`
	// ConditionalDelete: a delete with a stale If-Match is refused (the
	// store may then delete leases instead of marking them released).
	ConditionalDelete bool `json:"conditional_delete"`
}

// Err is nil when the report is OK, else an ErrNotShareable error naming
// the failed checks.
func (r *ProbeReport) Err() error {
	if r.OK {
		return nil
	}
	var failed []string
	for _, c := range r.Checks {
		if c.Required && !c.OK {
			failed = append(failed, c.Name+" ("+c.Detail+")")
		}
	}
	return fmt.Errorf("%s: %w: %s; machines sharing it could overwrite each other's work, so ferry refuses it ('ferry store doctor %s' prints the probe)",
		r.Store, ErrNotShareable, strings.Join(failed, "; "), r.Store)
}

// probePrefix is where Probe writes its scratch objects; a probe killed
// before it removed them leaves them to gc.
const probePrefix = "probe/"

// Probe checks that the storage honours the conditions the store relies
// on, with scratch objects under probe/ that it removes: servers have
// shipped without them (answering 200 to If-None-Match on an existing
// key, writing through If-Match on a missing key, ignoring conditional
// headers altogether), and a store shared on such a server would lose
// work silently.
func Probe(ctx context.Context, b Backend) *ProbeReport {
	rep := &ProbeReport{Store: b.String(), OK: true}
	var nonce [8]byte
	rand.Read(nonce[:])
	base := probePrefix + hex.EncodeToString(nonce[:])
	a, missing, bad, mp := base+"/a", base+"/missing", base+"/bad", base+"/multipart"
	defer func() {
		for _, k := range []string{a, missing, bad, mp} {
			b.Delete(context.WithoutCancel(ctx), k, "")
		}
	}()
	check := func(name string, required bool, ok bool, detail string, args ...any) bool {
		c := Check{Name: name, OK: ok, Required: required}
		if !ok {
			c.Detail = fmt.Sprintf(detail, args...)
			if required {
				rep.OK = false
			}
		}
		rep.Checks = append(rep.Checks, c)
		return ok
	}
	v1, v2, v3 := []byte("probe 1\n"), []byte("probe 2\n"), []byte("probe 3\n")

	in1, err := b.Put(ctx, a, v1, PutOptions{IfNoneMatch: true})
	if !check("create-only write of a new key", true, err == nil, "%v", err) {
		return rep // nothing else can be judged
	}
	_, err = b.Put(ctx, a, v2, PutOptions{IfNoneMatch: true})
	check("create-only write of an existing key is refused (412)", true, errors.Is(err, ErrPrecondition), "answered %v", orOK(err))
	got, in, gerr := b.Get(ctx, a, 1<<10)
	check("a refused write changes nothing", true, gerr == nil && bytes.Equal(got, v1), "the object holds %q (%v)", got, gerr)
	check("the storage answers with its clock (Date)", true, gerr == nil && !in.Date.IsZero() && !in.Modified.IsZero(),
		"Date %v, Last-Modified %v: lease ages cannot be judged", in.Date, in.Modified)

	_, err = b.Put(ctx, a, v3, PutOptions{IfMatch: `"0123456789abcdef0123456789abcdef"`})
	check("write with a stale If-Match is refused (412)", true, errors.Is(err, ErrPrecondition), "answered %v", orOK(err))
	in2, err := b.Put(ctx, a, v2, PutOptions{IfMatch: in1.ETag})
	got, _, gerr = b.Get(ctx, a, 1<<10)
	check("write with the current If-Match replaces", true, err == nil && gerr == nil && bytes.Equal(got, v2), "answered %v, object holds %q", orOK(err), got)
	_, err = b.Put(ctx, a, v3, PutOptions{IfMatch: in1.ETag})
	check("write with the replaced version's If-Match is refused (412)", true, errors.Is(err, ErrPrecondition), "answered %v", orOK(err))

	_, err = b.Put(ctx, missing, v1, PutOptions{IfMatch: in2.ETag})
	_, herr := b.Head(ctx, missing)
	check("write with If-Match on a missing key writes nothing", true, err != nil && errors.Is(herr, ErrNotFound),
		"answered %v, then the key %s", orOK(err), existsWord(herr))

	wrong := sha256.Sum256([]byte("not the body"))
	_, err = b.Put(ctx, bad, v1, PutOptions{IfNoneMatch: true, SHA256: &wrong})
	_, herr = b.Head(ctx, bad)
	check("a body that does not match its SHA-256 is refused and not stored", true, errors.Is(err, ErrBadDigest) && errors.Is(herr, ErrNotFound),
		"answered %v, then the key %s", orOK(err), existsWord(herr))

	mpOK, detail := probeMultipart(ctx, b, mp, a)
	check("multipart: a part that does not match its SHA-256 is refused; completion is create-only", true, mpOK, "%s", detail)

	err = b.Delete(ctx, a, `"0123456789abcdef0123456789abcdef"`)
	_, herr = b.Head(ctx, a)
	rep.ConditionalDelete = errors.Is(err, ErrPrecondition) && herr == nil
	check("delete with a stale If-Match is refused", false, rep.ConditionalDelete, "answered %v, then the key %s", orOK(err), existsWord(herr))
	return rep
}

// probeMultipart checks per-part checksums and create-only completion: a
// one-part upload to existing (which must be refused), then one to fresh.
func probeMultipart(ctx context.Context, b Backend, fresh, existing string) (bool, string) {
	body := []byte("probe part\n")
	sum := sha256.Sum256(body)
	wrong := sha256.Sum256([]byte("not the part"))
	id, err := b.CreateUpload(ctx, existing)
	if err != nil {
		return false, fmt.Sprintf("create upload: %v", err)
	}
	defer b.AbortUpload(context.WithoutCancel(ctx), existing, id)
	if _, err := b.UploadPart(ctx, existing, id, 1, body, wrong); !errors.Is(err, ErrBadDigest) {
		return false, fmt.Sprintf("a part with a wrong SHA-256 answered %v", orOK(err))
	}
	p, err := b.UploadPart(ctx, existing, id, 1, body, sum)
	if err != nil {
		return false, fmt.Sprintf("upload part: %v", err)
	}
	parts, err := b.ListParts(ctx, existing, id)
	if err != nil || len(parts) != 1 || parts[0].SHA256 != sum {
		return false, fmt.Sprintf("list parts: %v (%d parts)", err, len(parts))
	}
	if _, err := b.CompleteUpload(ctx, existing, id, []Part{p}, PutOptions{IfNoneMatch: true}); !errors.Is(err, ErrPrecondition) {
		return false, fmt.Sprintf("completing onto an existing key with If-None-Match answered %v", orOK(err))
	}
	id2, err := b.CreateUpload(ctx, fresh)
	if err != nil {
		return false, fmt.Sprintf("create upload: %v", err)
	}
	p, err = b.UploadPart(ctx, fresh, id2, 1, body, sum)
	if err == nil {
		_, err = b.CompleteUpload(ctx, fresh, id2, []Part{p}, PutOptions{IfNoneMatch: true})
	}
	if err != nil {
		b.AbortUpload(context.WithoutCancel(ctx), fresh, id2)
		return false, fmt.Sprintf("completing a new key: %v", err)
	}
	got, _, err := b.Get(ctx, fresh, 1<<10)
	if err != nil || !bytes.Equal(got, body) {
		return false, fmt.Sprintf("the completed object holds %q (%v)", got, err)
	}
	return true, ""
}

func orOK(err error) any {
	if err == nil {
		return "200 OK"
	}
	return err
}

func existsWord(headErr error) string {
	switch {
	case headErr == nil:
		return "exists"
	case errors.Is(headErr, ErrNotFound):
		return "does not exist"
	}
	return fmt.Sprintf("is unknown (%v)", headErr)
}
