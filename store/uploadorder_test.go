package store_test

import (
	"bytes"
	"context"
	mrand "math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/store"
	"github.com/ferry-llm/ferry/store/local"
)

// heldParts records the blob of each part uploaded, and holds the first
// one until released.
type heldParts struct {
	store.Backend
	mu      sync.Mutex
	order   []string
	entered chan struct{}
	release chan struct{}
}

func (b *heldParts) UploadPart(ctx context.Context, key, id string, n int, body []byte, sum [32]byte) (store.Part, error) {
	b.mu.Lock()
	b.order = append(b.order, key)
	first := len(b.order) == 1
	b.mu.Unlock()
	if first {
		close(b.entered)
		<-b.release
	}
	return b.Backend.UploadPart(ctx, key, id, n, body, sum)
}

// With the parts in flight bounded, a token given back goes to a part of
// the largest blob waiting: its completion is the longest, and the upload
// that ends a run is then a small one. An upload with no part moving goes
// before any other's next part: none waits for the larger ones to end.
func TestUploadLargestFirst(t *testing.T) {
	lb, err := local.New(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	b := &heldParts{Backend: lb, entered: make(chan struct{}), release: make(chan struct{})}
	ctx := context.Background()
	s, err := store.Open(ctx, b, store.Options{CacheDir: t.TempDir(), PartSize: store.MinPartSize, UploadParallel: 1, UploadInFlight: 1, SkipProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	r := mrand.NewChaCha8([32]byte{7})
	blob := func(parts int) ([]byte, digest.Digest) {
		data := make([]byte, parts*store.MinPartSize-1000)
		r.Read(data)
		return data, digest.Of(data)
	}
	small, ds := blob(2)
	mid, dm := blob(3)
	big, db := blob(4)
	errs := make(chan error, 3)
	put := func(data []byte, d digest.Digest) {
		go func() { errs <- s.PutBlob(ctx, d, bytes.NewReader(data), int64(len(data)), nil) }()
	}
	waiting := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); s.UploadsWaiting() < n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d parts wait for a token, want %d", s.UploadsWaiting(), n)
			}
		}
	}
	// The small blob's first part holds the one token; its second part,
	// then the mid one's and the big one's first, wait for it.
	put(small, ds)
	<-b.entered
	waiting(1)
	put(mid, dm)
	waiting(2)
	put(big, db)
	waiting(3)
	close(b.release)
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.order) != 9 {
		t.Fatalf("%d parts uploaded, want 9", len(b.order))
	}
	if b.order[0] != store.BlobKey(ds) || b.order[1] != store.BlobKey(db) {
		t.Errorf("after the small blob's first part came %s, want the big blob's (%s)", b.order[1], store.BlobKey(db))
	}
	// Then the mid blob's first, before the small one's second and the
	// big one's next.
	if b.order[2] != store.BlobKey(dm) {
		t.Errorf("third part %s, want the mid blob's first (%s)", b.order[2], store.BlobKey(dm))
	}
	for _, c := range []struct {
		d    digest.Digest
		size int
	}{{ds, len(small)}, {dm, len(mid)}, {db, len(big)}} {
		if n, ok, err := s.HasBlob(ctx, c.d); err != nil || !ok || n != int64(c.size) {
			t.Errorf("blob %s: %d bytes, there %v, %v", c.d.Short(), n, ok, err)
		}
	}
}
