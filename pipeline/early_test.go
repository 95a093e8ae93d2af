package pipeline

import (
	"context"
	"errors"
	"testing"

	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/store"
)

// An output stored early counts as stored for a share under the lease it
// was stored under only: under a lease regained after it was lost (and
// maybe taken over, the blob unprotected meanwhile) share looks again. A
// failed upload, one never started and a nil earlyShare count as not
// stored.
func TestEarlyStoredUnderItsLease(t *testing.T) {
	ctx := context.Background()
	held, regained := &store.Lease{}, &store.Lease{}
	stored := manifest.NewDigest(make([]byte, 32))
	failed := manifest.NewDigest(append(make([]byte, 31), 1))
	never := manifest.NewDigest(append(make([]byte, 31), 2))
	done := func(err error) *earlyUpload {
		u := &earlyUpload{done: make(chan struct{}), err: err}
		close(u.done)
		return u
	}
	e := &earlyShare{l: held, ups: map[manifest.Digest]*earlyUpload{stored: done(nil), failed: done(errors.New("refused"))}}
	for _, c := range []struct {
		e    *earlyShare
		l    *store.Lease
		d    manifest.Digest
		want bool
	}{
		{e, held, stored, true},
		{e, regained, stored, false},
		{e, held, failed, false},
		{e, held, never, false},
		{nil, held, stored, false},
	} {
		if got := c.e.stored(ctx, c.l, c.d); got != c.want {
			t.Errorf("stored(%v, lease regained %v, %s) = %v, want %v", c.e != nil, c.l == regained, c.d.Short(), got, c.want)
		}
	}
}
