// Package storetest is the one conformance suite every store backend
// runs (store/local on a directory, store/s3 on a real versitygw): the
// backend's conditions, the 412 paths, 32 goroutines racing for one key,
// blobs small and multipart, uploads and downloads killed after k parts
// and resumed, a storage that returns bytes that do not match a blob's
// digest, records, refs, and leases with renewal, expiry, takeover and
// loss. A backend is done when it passes.
package storetest

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/store"
	"golang.org/x/sync/errgroup"
)

// Harness is what a backend gives the suite.
type Harness struct {
	// New returns a new, empty store on the backend (each test gets one).
	New func(t *testing.T) store.Backend
	// Damage changes the stored bytes of key behind the backend's back,
	// keeping its size, as a failing disk or a broken server would.
	Damage func(t *testing.T, b store.Backend, key string)
	// Age moves key's last write back by d behind the backend's back, as
	// time passing would.
	Age func(t *testing.T, b store.Backend, key string, d time.Duration)
	// LeaseTTL is the ttl lease tests use: short, but several times the
	// storage's clock granularity (S3 dates have whole seconds).
	LeaseTTL time.Duration
}

// Run runs the suite.
func Run(t *testing.T, h Harness) {
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, Harness)
	}{
		{"Probe", testProbe},
		{"ProbeRefusesIgnoredConditions", testProbeRefuses},
		{"Format", testFormat},
		{"Objects", testObjects},
		{"Preconditions", testPreconditions},
		{"BadDigest", testBadDigest},
		{"Race", testRace},
		{"SmallBlob", testSmallBlob},
		{"MultipartBlob", testMultipartBlob},
		{"PutFile", testPutFile},
		{"PutKnownFile", testPutKnownFile},
		{"SameBlobAtOnce", testSameBlobAtOnce},
		{"UploadResume", testUploadResume},
		{"UploadInFlight", testUploadInFlight},
		{"UploadSourceChanged", testUploadSourceChanged},
		{"DownloadResume", testDownloadResume},
		{"DamagedBlob", testDamagedBlob},
		{"VerifyRefs", testVerifyRefs},
		{"GCUnreadableLease", testGCUnreadableLease},
		{"GCPruneRecords", testGCPruneRecords},
		{"LeaseRemoved", testLeaseRemoved},
		{"Marks", testMarks},
		{"FetchBlobRemoved", testFetchBlobRemoved},
		{"Records", testRecords},
		{"Refs", testRefs},
		{"Leases", testLeases},
		{"LeaseExpiry", testLeaseExpiry},
		{"LeaseLost", testLeaseLost},
		{"LeaseAnswersLost", testLeaseAnswersLost},
		{"LeaseResume", testLeaseResume},
		{"GCWhileReusing", testGCWhileReusing},
		{"Verify", testVerify},
		{"GC", testGC},
		{"MaintainWithCache", testMaintainWithCache},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, h) })
	}
}

// AgeFile moves the modification time of the file at p back by d: an
// object aged on the storage's disk, for an Age.
func AgeFile(t *testing.T, p string, d time.Duration) {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	when := fi.ModTime().Add(-d)
	if err := os.Chtimes(p, when, when); err != nil {
		t.Fatal(err)
	}
}

// DamageFile flips four bytes in the middle of the file at p, keeping its
// size and inode: a blob damaged on the storage's disk, for a Damage.
func DamageFile(t *testing.T, p string) {
	t.Helper()
	if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o200 == 0 {
		os.Chmod(p, fi.Mode().Perm()|0o200) // a read-only blob
		defer os.Chmod(p, fi.Mode().Perm())
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	off := fi.Size() / 2
	if _, err := f.ReadAt(buf, off); err != nil {
		t.Fatal(err)
	}
	for i := range buf {
		buf[i] ^= 0x5a
	}
	if _, err := f.WriteAt(buf, off); err != nil {
		t.Fatal(err)
	}
}

// noUploads fails t if b holds an unfinished upload.
func noUploads(t *testing.T, b store.Backend) {
	t.Helper()
	if err := b.ListUploads(context.Background(), "", func(u store.Upload) error {
		return fmt.Errorf("upload %s of %s left", u.ID, u.Key)
	}); err != nil {
		t.Error(err)
	}
}

func open(t *testing.T, b store.Backend, host string, mod ...func(*store.Options)) *store.Store {
	t.Helper()
	opt := store.Options{CacheDir: filepath.Join(t.TempDir(), "cache"), Host: host, PartSize: store.MinPartSize, Parallel: 2}
	for _, m := range mod {
		m(&opt)
	}
	s, err := store.Open(context.Background(), b, opt)
	if err != nil {
		t.Fatalf("open %s: %v", b, err)
	}
	return s
}

func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for k := range 8 {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

func testProbe(t *testing.T, h Harness) {
	b := h.New(t)
	rep := store.Probe(context.Background(), b)
	for _, c := range rep.Checks {
		if !c.OK {
			t.Errorf("probe check failed: %s: %s", c.Name, c.Detail)
		}
	}
	if !rep.OK || rep.Err() != nil || len(rep.Checks) < 10 {
		t.Fatalf("probe: ok %v, %d checks, err %v", rep.OK, len(rep.Checks), rep.Err())
	}
	// It cleans up after itself.
	if err := b.List(context.Background(), "probe/", func(in store.Info) error {
		return fmt.Errorf("probe left %s", in.Key)
	}); err != nil {
		t.Error(err)
	}
	if err := b.ListUploads(context.Background(), "", func(u store.Upload) error {
		return fmt.Errorf("probe left upload %s of %s", u.ID, u.Key)
	}); err != nil {
		t.Error(err)
	}
}

// ignoring is the backend as a server that ignores conditional headers
// (as Incus' S3 does) serves it: every write goes through.
type ignoring struct{ store.Backend }

func (b ignoring) Put(ctx context.Context, key string, body []byte, opt store.PutOptions) (store.Info, error) {
	return b.Backend.Put(ctx, key, body, store.PutOptions{SHA256: opt.SHA256})
}

func (b ignoring) CompleteUpload(ctx context.Context, key, id string, parts []store.Part, opt store.PutOptions) (store.Info, error) {
	return b.Backend.CompleteUpload(ctx, key, id, parts, store.PutOptions{})
}

func (b ignoring) Delete(ctx context.Context, key, ifMatch string) error {
	return b.Backend.Delete(ctx, key, "")
}

// failingDelete is a server that answers a conditional delete with an
// error that is not 412 (501 Not Implemented, say) and deletes nothing.
type failingDelete struct{ store.Backend }

func (b failingDelete) Delete(ctx context.Context, key, ifMatch string) error {
	if ifMatch != "" {
		return errors.New("501 Not Implemented")
	}
	return b.Backend.Delete(ctx, key, "")
}

// A server that ignores conditional writes fails the probe, and Open
// refuses it with an error that names what failed.
func testProbeRefuses(t *testing.T, h Harness) {
	b := ignoring{h.New(t)}
	rep := store.Probe(context.Background(), b)
	if rep.OK || rep.ConditionalDelete {
		t.Fatalf("probe passed a server that ignores conditions: %+v", rep)
	}
	_, err := store.Open(context.Background(), b, store.Options{CacheDir: t.TempDir()})
	if !errors.Is(err, store.ErrNotShareable) || errkind.Of(err) != errkind.Usage ||
		!strings.Contains(err.Error(), "create-only write of an existing key is refused (412) (answered 200 OK)") ||
		!strings.Contains(err.Error(), "ferry store doctor") {
		t.Fatalf("open: %v", err)
	}
	if _, err := b.Head(context.Background(), "format"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a refused store was written to: %v", err)
	}
	// A conditional delete answered with another error is not one the
	// server honours: gc then keeps old leases instead of failing.
	if rep := store.Probe(context.Background(), failingDelete{h.New(t)}); !rep.OK || rep.ConditionalDelete {
		t.Errorf("probe of a server failing conditional deletes: %+v", rep)
	}
}

func testFormat(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	open(t, b, "a")
	open(t, b, "b") // a second open reads the format object
	body, _, err := b.Get(ctx, "format", 1<<10)
	if err != nil || !bytes.Contains(body, []byte(`"format":"ferry-store"`)) {
		t.Fatalf("format object: %q, %v", body, err)
	}
	other := h.New(t)
	if _, err := other.Put(ctx, "format", []byte("something else\n"), store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Open(ctx, other, store.Options{CacheDir: t.TempDir()}); err == nil {
		t.Fatal("opened a store whose format object is not ferry's")
	}
}

func testObjects(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	keys := []string{"a/b/c", "a/b-c", "a/bc", "a0", "z"}
	for i, k := range keys {
		if _, err := b.Put(ctx, k, []byte(fmt.Sprintf("object %d", i)), store.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var listed []string
	if err := b.List(ctx, "a", func(in store.Info) error { listed = append(listed, in.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(listed) != "[a/b-c a/b/c a/bc a0]" {
		t.Errorf("List(a) = %v", listed)
	}
	listed = nil
	b.List(ctx, "a/b", func(in store.Info) error { listed = append(listed, in.Key); return nil })
	if fmt.Sprint(listed) != "[a/b-c a/b/c a/bc]" {
		t.Errorf("List(a/b) = %v", listed)
	}
	in, err := b.Head(ctx, "a/bc")
	if err != nil || in.Size != 8 || in.ETag == "" || in.Date.IsZero() || in.Modified.IsZero() {
		t.Fatalf("Head: %+v, %v", in, err)
	}
	if age := in.Date.Sub(in.Modified); age < -2*time.Second || age > time.Minute {
		t.Errorf("age by the storage's clock: %v", age)
	}
	buf := make([]byte, 3)
	if err := b.GetRange(ctx, "a/bc", 2, buf); err != nil || string(buf) != "jec" {
		t.Errorf("GetRange: %q, %v", buf, err)
	}
	if err := b.GetRange(ctx, "a/bc", 6, buf); err == nil {
		t.Error("GetRange past the end: no error")
	}
	if _, _, err := b.Get(ctx, "a/bc", 4); !errors.Is(err, store.ErrTooLarge) {
		t.Errorf("Get over max: %v", err)
	}
	if _, err := b.Head(ctx, "nothing"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Head of a missing key: %v", err)
	}
	if _, _, err := b.Get(ctx, "nothing", 10); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get of a missing key: %v", err)
	}
	if err := b.Delete(ctx, "a0", ""); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(ctx, "a0", ""); err != nil {
		t.Errorf("deleting a missing key: %v", err)
	}
	if _, err := b.Head(ctx, "a0"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Head after Delete: %v", err)
	}
}

// Every way a condition refuses a write (412), and that a refused write
// changes nothing.
func testPreconditions(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	v1, err := b.Put(ctx, "k", []byte("one"), store.PutOptions{IfNoneMatch: true})
	if err != nil {
		t.Fatal(err)
	}
	v2, err := b.Put(ctx, "k", []byte("two"), store.PutOptions{IfMatch: v1.ETag})
	if err != nil {
		t.Fatal(err)
	}
	body := []byte("part")
	sum := sha256.Sum256(body)
	for _, tc := range []struct {
		name string
		do   func() error
	}{
		{"create-only on an existing key", func() error {
			_, err := b.Put(ctx, "k", []byte("three"), store.PutOptions{IfNoneMatch: true})
			return err
		}},
		{"If-Match with a replaced version", func() error {
			_, err := b.Put(ctx, "k", []byte("three"), store.PutOptions{IfMatch: v1.ETag})
			return err
		}},
		{"If-Match with a made-up ETag", func() error {
			_, err := b.Put(ctx, "k", []byte("three"), store.PutOptions{IfMatch: `"00000000000000000000000000000000"`})
			return err
		}},
		{"delete with a replaced version's If-Match", func() error { return b.Delete(ctx, "k", v1.ETag) }},
		{"multipart completion create-only on an existing key", func() error {
			id, err := b.CreateUpload(ctx, "k")
			if err != nil {
				return err
			}
			defer b.AbortUpload(ctx, "k", id)
			p, err := b.UploadPart(ctx, "k", id, 1, body, sum)
			if err != nil {
				return err
			}
			_, err = b.CompleteUpload(ctx, "k", id, []store.Part{p}, store.PutOptions{IfNoneMatch: true})
			return err
		}},
	} {
		if err := tc.do(); !errors.Is(err, store.ErrPrecondition) {
			t.Errorf("%s: %v, want ErrPrecondition", tc.name, err)
		}
		got, in, err := b.Get(ctx, "k", 100)
		if err != nil || string(got) != "two" || in.ETag != v2.ETag {
			t.Fatalf("after %s: %q (etag %s, want %s), %v", tc.name, got, in.ETag, v2.ETag, err)
		}
	}
	if _, err := b.Put(ctx, "missing", []byte("x"), store.PutOptions{IfMatch: v2.ETag}); err == nil {
		t.Error("If-Match on a missing key wrote")
	}
	if _, err := b.Head(ctx, "missing"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("If-Match on a missing key left %v", err)
	}
	if err := b.Delete(ctx, "k", v2.ETag); err != nil {
		t.Errorf("delete with the current If-Match: %v", err)
	}
}

func testBadDigest(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	wrong := sha256.Sum256([]byte("other"))
	if _, err := b.Put(ctx, "x", []byte("body"), store.PutOptions{SHA256: &wrong}); !errors.Is(err, store.ErrBadDigest) {
		t.Errorf("Put with a wrong SHA-256: %v", err)
	}
	if _, err := b.Head(ctx, "x"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a refused body was stored: %v", err)
	}
	id, err := b.CreateUpload(ctx, "y")
	if err != nil {
		t.Fatal(err)
	}
	defer b.AbortUpload(ctx, "y", id)
	if _, err := b.UploadPart(ctx, "y", id, 1, []byte("body"), wrong); !errors.Is(err, store.ErrBadDigest) {
		t.Errorf("UploadPart with a wrong SHA-256: %v", err)
	}
	if parts, err := b.ListParts(ctx, "y", id); err != nil || len(parts) != 0 {
		t.Errorf("a refused part is listed: %v, %v", parts, err)
	}
}

// racers is how many goroutines race for one key.
const racers = 32

// Exactly one of 32 racing create-only writers wins, and the object holds
// its bytes; likewise 32 compare-and-swaps from one version, and 32 lease
// acquisitions.
func testRace(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	race := func(name string, do func(i int) error) int {
		var wins atomic.Int64
		winner := -1
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				err := do(i)
				switch {
				case err == nil:
					wins.Add(1)
					mu.Lock()
					winner = i
					mu.Unlock()
				case errors.Is(err, store.ErrPrecondition), errors.Is(err, store.ErrRefConflict), errors.Is(err, store.ErrLeaseHeld):
				default:
					t.Errorf("%s: racer %d: %v", name, i, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		if wins.Load() != 1 {
			t.Fatalf("%s: %d of %d racers won, want exactly 1", name, wins.Load(), racers)
		}
		return winner
	}
	w := race("create-only", func(i int) error {
		_, err := b.Put(ctx, "race/create", []byte(fmt.Sprintf("racer %d", i)), store.PutOptions{IfNoneMatch: true})
		return err
	})
	if got, _, _ := b.Get(ctx, "race/create", 100); string(got) != fmt.Sprintf("racer %d", w) {
		t.Errorf("create-only: object holds %q, winner was %d", got, w)
	}
	s := open(t, b, "racer")
	base, err := s.SetRef(ctx, "race/ref", "base", nil)
	if err != nil {
		t.Fatal(err)
	}
	w = race("compare-and-swap", func(i int) error {
		_, err := s.SetRef(ctx, "race/ref", fmt.Sprintf("racer-%d", i), &base)
		return err
	})
	if r, err := s.GetRef(ctx, "race/ref"); err != nil || r.Value != fmt.Sprintf("racer-%d", w) {
		t.Errorf("compare-and-swap: ref is %q (%v), winner was %d", r.Value, err, w)
	}
	var leases sync.Map
	w = race("lease", func(i int) error {
		l, err := s.AcquireLease(ctx, "race/lease", time.Minute)
		if err == nil {
			leases.Store(i, l)
		}
		return err
	})
	l, _ := leases.Load(w)
	if err := l.(*store.Lease).Release(ctx); err != nil {
		t.Error(err)
	}
}

func testSmallBlob(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	s := open(t, b, "a")
	data := []byte("a small blob\n")
	d := digest.Of(data)
	var got int64
	if err := s.PutBlob(ctx, d, bytes.NewReader(data), int64(len(data)), func(n int64) { got += n }); err != nil {
		t.Fatal(err)
	}
	if got != int64(len(data)) {
		t.Errorf("progress: %d bytes", got)
	}
	// Again: already there is success.
	if err := s.PutBlob(ctx, d, bytes.NewReader(data), int64(len(data)), nil); err != nil {
		t.Fatalf("second PutBlob: %v", err)
	}
	if size, ok, err := s.HasBlob(ctx, d); !ok || err != nil || size != int64(len(data)) {
		t.Fatalf("HasBlob: %d %v %v", size, ok, err)
	}
	if body, err := s.ReadBlob(ctx, d, 100); err != nil || !bytes.Equal(body, data) {
		t.Fatalf("ReadBlob: %q %v", body, err)
	}
	// Bytes that are not d's are refused before anything is stored.
	other := []byte("another blob\n")
	if err := s.PutBlob(ctx, digest.Of([]byte("x")), bytes.NewReader(other), int64(len(other)), nil); !errors.Is(err, store.ErrDigestMismatch) {
		t.Errorf("PutBlob of the wrong bytes: %v", err)
	}
	if _, ok, _ := s.HasBlob(ctx, digest.Of([]byte("x"))); ok {
		t.Error("the wrong bytes were stored")
	}
	dst := filepath.Join(t.TempDir(), "out")
	if err := s.FetchBlob(ctx, d, dst, nil); err != nil {
		t.Fatal(err)
	}
	if f, _ := os.ReadFile(dst); !bytes.Equal(f, data) {
		t.Errorf("fetched %q", f)
	}
	if err := s.FetchBlob(ctx, digest.Of([]byte("x")), dst+"2", nil); !errors.Is(err, store.ErrBlobMissing) {
		t.Errorf("fetch of a missing blob: %v", err)
	}
}

// partSize is the suite's part size: S3's minimum.
const partSize = store.MinPartSize

func multipartData(seed uint64) []byte { return randBytes(seed, 3*partSize+12345) }

func testMultipartBlob(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	s := open(t, b, "a")
	data := multipartData(1)
	d := digest.Of(data)
	var got atomic.Int64
	if err := s.PutBlob(ctx, d, bytes.NewReader(data), int64(len(data)), func(n int64) { got.Add(n) }); err != nil {
		t.Fatal(err)
	}
	if got.Load() != int64(len(data)) {
		t.Errorf("progress: %d of %d bytes", got.Load(), len(data))
	}
	if size, ok, err := s.HasBlob(ctx, d); !ok || err != nil || size != int64(len(data)) {
		t.Fatalf("HasBlob: %d %v %v", size, ok, err)
	}
	noUploads(t, b)
	dst := filepath.Join(t.TempDir(), "out")
	if err := s.FetchBlob(ctx, d, dst, nil); err != nil {
		t.Fatal(err)
	}
	if f, _ := os.ReadFile(dst); !bytes.Equal(f, data) {
		t.Error("fetched bytes differ")
	}
	if m, _ := filepath.Glob(dst + ".*"); len(m) != 0 {
		t.Errorf("left behind: %v", m)
	}
	// A second machine storing the same blob finds it there.
	s2 := open(t, b, "b")
	if err := s2.PutBlob(ctx, d, bytes.NewReader(data), int64(len(data)), nil); err != nil {
		t.Fatal(err)
	}
}

// counting counts a backend's part uploads and ranged reads.
type counting struct {
	store.Backend
	parts, ranges atomic.Int64
}

func (c *counting) UploadPart(ctx context.Context, key, id string, n int, body []byte, sum [32]byte) (store.Part, error) {
	p, err := c.Backend.UploadPart(ctx, key, id, n, body, sum)
	if err == nil {
		c.parts.Add(1)
	}
	return p, err
}

func (c *counting) GetRange(ctx context.Context, key string, off int64, buf []byte) error {
	err := c.Backend.GetRange(ctx, key, off, buf)
	if err == nil {
		c.ranges.Add(1)
	}
	return err
}

// An upload killed after k parts resumes from the parts the storage
// lists and the journaled hash state: no part is stored twice.
func testUploadResume(t *testing.T, h Harness) {
	const k = 2
	data := multipartData(2)
	nparts := int64((len(data) + partSize - 1) / partSize)
	d := digest.Of(data)
	b := &counting{Backend: h.New(t)}
	cache := t.TempDir()
	s := open(t, b, "a", func(o *store.Options) { o.CacheDir = cache; o.Parallel = 1 })
	b.parts.Store(0) // the probe's
	ctx, cancel := context.WithCancel(context.Background())
	var done int64
	err := s.PutBlob(ctx, d, bytes.NewReader(data), int64(len(data)), func(n int64) {
		if done += n; done >= k*partSize {
			cancel() // killed after k parts
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("killed upload: %v", err)
	}
	first := b.parts.Load()
	if first < k || first >= nparts {
		t.Fatalf("killed upload stored %d parts", first)
	}
	if _, ok, _ := s.HasBlob(context.Background(), d); ok {
		t.Fatal("a killed upload left a blob")
	}
	s = open(t, b, "a", func(o *store.Options) { o.CacheDir = cache })
	b.parts.Store(first)
	var resumed int64
	if err := s.PutBlob(context.Background(), d, bytes.NewReader(data), int64(len(data)), func(n int64) { resumed += n }); err != nil {
		t.Fatal(err)
	}
	if total := b.parts.Load(); total != nparts {
		t.Errorf("parts stored: %d before the kill + %d after = %d, want %d (each once)", first, total-first, total, nparts)
	}
	if resumed != int64(len(data)) {
		t.Errorf("resume reported %d of %d bytes", resumed, len(data))
	}
	got := make([]byte, len(data))
	if err := b.GetRange(context.Background(), store.BlobKey(d), 0, got); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("resumed blob differs: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(cache, "uploads", "*", "*")); len(m) != 0 {
		t.Errorf("journal left: %v", m)
	}
}

// inFlight counts a backend's part uploads under way, and the most at
// once; each is held a while, so that the ones a store lets overlap do.
type inFlight struct {
	store.Backend
	mu       sync.Mutex
	now, top int
	hold     time.Duration
	started  func() // called as each part starts, if set
}

func (c *inFlight) UploadPart(ctx context.Context, key, id string, n int, body []byte, sum [32]byte) (store.Part, error) {
	c.mu.Lock()
	c.now++
	c.top = max(c.top, c.now)
	started := c.started
	c.mu.Unlock()
	if started != nil {
		started()
	}
	defer func() {
		c.mu.Lock()
		c.now--
		c.mu.Unlock()
	}()
	select {
	case <-time.After(c.hold):
	case <-ctx.Done():
		return store.Part{}, ctx.Err()
	}
	return c.Backend.UploadPart(ctx, key, id, n, body, sum)
}

func (c *inFlight) reset() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	top := c.top
	c.top = 0
	return top
}

// Options.UploadInFlight bounds the parts moving over all uploads side by
// side; an upload alone has up to UploadParallel of them (more than
// Parallel); an upload cut short gives its share back.
func testUploadInFlight(t *testing.T, h Harness) {
	// Each part held long enough for the reader to hash and hand over
	// the next three meanwhile (100 ms was too short under -race).
	b := &inFlight{Backend: h.New(t), hold: 500 * time.Millisecond}
	s := open(t, b, "a", func(o *store.Options) { o.Parallel, o.UploadParallel, o.UploadInFlight = 1, 4, 4 })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	put := func(ctx context.Context, seed uint64) error {
		data := multipartData(seed) // 4 parts
		return s.PutBlob(ctx, digest.Of(data), bytes.NewReader(data), int64(len(data)), nil)
	}
	b.reset()

	// Alone: all four parts at once.
	if err := put(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if top := b.reset(); top != 4 {
		t.Errorf("one upload alone: %d parts at once, want UploadParallel's 4", top)
	}

	// Three side by side: never more than four parts between them.
	g, gctx := errgroup.WithContext(ctx)
	for seed := range uint64(3) {
		g.Go(func() error { return put(gctx, 20+seed) })
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if top := b.reset(); top > 4 || top < 2 {
		t.Errorf("three uploads side by side: %d parts at once, want 2 to UploadInFlight's 4", top)
	}

	// Cut short while its parts move: what it held is free again, and the
	// next uploads (each needing the whole bound) finish.
	cut, stop := context.WithCancel(ctx)
	var parts atomic.Int32
	b.mu.Lock()
	b.started = func() {
		if parts.Add(1) == 3 {
			stop()
		}
	}
	b.mu.Unlock()
	if err := put(cut, 30); !errors.Is(err, context.Canceled) {
		t.Fatalf("upload cut short: %v", err)
	}
	b.mu.Lock()
	b.started = nil
	b.mu.Unlock()
	for seed := range uint64(2) {
		if err := put(ctx, 40+seed); err != nil {
			t.Fatalf("upload after one cut short: %v", err)
		}
	}
	if top := b.reset(); top != 4 {
		t.Errorf("after an upload cut short: %d parts at once, want 4 (its share given back)", top)
	}
}

// changingReader returns data, but other bytes once read past off.
type changingReader struct {
	data []byte
	off  int64
}

func (r *changingReader) ReadAt(p []byte, off int64) (int, error) {
	n := copy(p, r.data[off:])
	if off+int64(n) > r.off {
		for i := max(r.off-off, 0); i < int64(n); i++ {
			p[i] ^= 0xff
		}
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// A source whose bytes change while it is uploaded does not become a blob,
// and its upload is dropped.
func testUploadSourceChanged(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	s := open(t, b, "a")
	data := multipartData(3)
	d := digest.Of(data)
	err := s.PutBlob(ctx, d, &changingReader{data, 3 * partSize}, int64(len(data)), nil)
	if !errors.Is(err, store.ErrDigestMismatch) {
		t.Fatalf("upload of a changing source: %v", err)
	}
	if _, ok, _ := s.HasBlob(ctx, d); ok {
		t.Fatal("a changing source became a blob")
	}
	noUploads(t, b)
}

// A download killed after k chunks resumes after them.
func testDownloadResume(t *testing.T, h Harness) {
	const k = 2
	data := multipartData(4)
	nchunks := int64((len(data) + partSize - 1) / partSize)
	d := digest.Of(data)
	b := &counting{Backend: h.New(t)}
	// A checkpoint after every chunk (by default, after a second's).
	s := open(t, b, "a", func(o *store.Options) { o.Parallel = 1; o.CheckpointEvery = time.Nanosecond })
	if err := s.PutBlob(context.Background(), d, bytes.NewReader(data), int64(len(data)), nil); err != nil {
		t.Fatal(err)
	}
	b.ranges.Store(0)
	dst := filepath.Join(t.TempDir(), "out")
	ctx, cancel := context.WithCancel(context.Background())
	var done int64
	err := s.FetchBlob(ctx, d, dst, func(n int64) {
		if done += n; done >= k*partSize {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("killed download: %v", err)
	}
	if _, err := os.Stat(dst); err == nil {
		t.Fatal("a killed download left its file")
	}
	first := b.ranges.Load()
	var resumed int64
	if err := s.FetchBlob(context.Background(), d, dst, func(n int64) { resumed += n }); err != nil {
		t.Fatal(err)
	}
	if f, _ := os.ReadFile(dst); !bytes.Equal(f, data) {
		t.Fatal("resumed download differs")
	}
	// Chunks read before the kill and not yet journaled are read again:
	// at most the ones in flight (Parallel+1).
	if again := b.ranges.Load() - first; again > nchunks-k {
		t.Errorf("resume read %d chunks, want at most %d", again, nchunks-k)
	}
	if resumed != int64(len(data)) {
		t.Errorf("resume reported %d of %d bytes", resumed, len(data))
	}
}

// Bytes the storage returns that do not hash to the blob's digest are
// never handed out, and nothing that looks complete is left.
func testDamagedBlob(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	s := open(t, b, "a")
	for _, data := range [][]byte{[]byte("small blob, damaged\n"), multipartData(5)} {
		d := digest.Of(data)
		if err := s.PutBlob(ctx, d, bytes.NewReader(data), int64(len(data)), nil); err != nil {
			t.Fatal(err)
		}
		h.Damage(t, b, store.BlobKey(d))
		dst := filepath.Join(t.TempDir(), "out")
		if err := s.FetchBlob(ctx, d, dst, nil); !errors.Is(err, store.ErrDigestMismatch) {
			t.Errorf("%d-byte blob: fetch of damaged bytes: %v", len(data), err)
		}
		if m, _ := filepath.Glob(dst + "*"); len(m) != 0 {
			t.Errorf("%d-byte blob: left %v", len(data), m)
		}
		if _, err := s.ReadBlob(ctx, d, int64(len(data))); !errors.Is(err, store.ErrDigestMismatch) {
			t.Errorf("%d-byte blob: read of damaged bytes: %v", len(data), err)
		}
		// RemoveDamaged takes the fetch's error: it removes the blob only
		// when a second read gives what the fetch got, of the version the
		// fetch read.
		err := s.FetchBlob(ctx, d, dst, nil)
		var dm *store.DamagedError
		if !errors.As(err, &dm) || dm.Blob != d || dm.Got == d || dm.ETag == "" || dm.Size != int64(len(data)) {
			t.Fatalf("%d-byte blob: fetch of damaged bytes: %v (%+v)", len(data), err, dm)
		}
		for _, c := range []struct {
			name string
			bad  store.DamagedError
			want string
		}{
			{"reads damaged on the way", store.DamagedError{Blob: d, Got: digest.Of([]byte("other")), ETag: dm.ETag}, "the reads, not the blob, may be damaged"},
			{"replaced since", store.DamagedError{Blob: d, Got: dm.Got, ETag: `"not-the-version-read"`}, "replaced while it was read"},
		} {
			if err := s.RemoveDamaged(ctx, &c.bad); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%d-byte blob, %s: RemoveDamaged: %v", len(data), c.name, err)
			}
			if _, ok, err := s.HasBlob(ctx, d); !ok || err != nil {
				t.Fatalf("%d-byte blob, %s: removed (%v)", len(data), c.name, err)
			}
		}
		if err := s.RemoveDamaged(ctx, dm); err != nil {
			t.Fatalf("%d-byte blob: RemoveDamaged: %v", len(data), err)
		}
		if _, ok, err := s.HasBlob(ctx, d); ok || err != nil {
			t.Errorf("%d-byte blob: still stored after RemoveDamaged (%v)", len(data), err)
		}
		// Stored again whole, it is fetched.
		if err := s.PutBlob(ctx, d, bytes.NewReader(data), int64(len(data)), nil); err != nil {
			t.Fatal(err)
		}
		if err := s.FetchBlob(ctx, d, dst, nil); err != nil {
			t.Errorf("%d-byte blob stored again: %v", len(data), err)
		}
		os.Remove(dst)
	}
}

func testRecords(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	s := open(t, b, "machine-a")
	data := []byte("output bytes")
	d := digest.Of(data)
	rec := &store.Record{Key: "k1", Outputs: []store.Output{{Path: "out.bin", Digest: d, Size: int64(len(data))}}, Meta: []byte(`{"kind":"test"}`)}
	if _, err := s.CommitRecord(ctx, rec); !errors.Is(err, store.ErrBlobMissing) {
		t.Fatalf("record of a missing blob: %v", err)
	}
	if _, err := s.Record(ctx, "k1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused record was written: %v", err)
	}
	if err := s.PutBlob(ctx, d, bytes.NewReader(data), int64(len(data)), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CommitRecord(ctx, rec); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, b, "machine-b")
	again := &store.Record{Key: "k1", Outputs: rec.Outputs, Meta: []byte(`{"kind":"test","again":true}`)}
	stands, err := s2.CommitRecord(ctx, again)
	if !errors.Is(err, store.ErrRecordExists) || stands == nil || stands.Host != "machine-a" || string(stands.Meta) != `{"kind":"test"}` {
		t.Fatalf("second commit: %+v, %v", stands, err)
	}
	got, err := s2.Record(ctx, "k1")
	if err != nil || got.Host != "machine-a" || len(got.Outputs) != 1 || got.Outputs[0].Digest != d {
		t.Fatalf("Record: %+v, %v", got, err)
	}
	var keys []string
	s.Records(ctx, func(k string) error { keys = append(keys, k); return nil })
	if fmt.Sprint(keys) != "[k1]" {
		t.Errorf("Records: %v", keys)
	}
	if _, err := s.CommitRecord(ctx, &store.Record{Key: "../x"}); err == nil {
		t.Error("record key ../x accepted")
	}
}

func testRefs(t *testing.T, h Harness) {
	ctx := context.Background()
	s := open(t, h.New(t), "a")
	if _, err := s.GetRef(ctx, "p/stage"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing ref: %v", err)
	}
	r1, err := s.SetRef(ctx, "p/stage", "key1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetRef(ctx, "p/stage", "key2", nil); !errors.Is(err, store.ErrRefConflict) {
		t.Errorf("creating an existing ref: %v", err)
	}
	r2, err := s.SetRef(ctx, "p/stage", "key2", &r1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetRef(ctx, "p/stage", "key3", &r1); !errors.Is(err, store.ErrRefConflict) {
		t.Errorf("swap from a stale ref: %v", err)
	}
	got, err := s.GetRef(ctx, "p/stage")
	if err != nil || got.Value != "key2" || got.ETag != r2.ETag {
		t.Errorf("ref: %+v (want etag %s), %v", got, r2.ETag, err)
	}
}

func testLeases(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	a, bb := open(t, b, "machine-a"), open(t, b, "machine-b")
	ttl := h.LeaseTTL
	// A ttl shorter than three of the storage's date grains is refused.
	if min := a.MinLeaseTTL(); ttl < min {
		t.Fatalf("the harness's ttl %v is under the store's minimum %v", ttl, min)
	} else if _, err := a.AcquireLease(ctx, "stage/short", min-time.Millisecond); err == nil || !strings.Contains(err.Error(), "too short") {
		t.Fatalf("a lease of %v (minimum %v): %v", min-time.Millisecond, min, err)
	}
	la, err := a.AcquireLease(ctx, "stage/k1", ttl)
	if err != nil {
		t.Fatal(err)
	}
	_, err = bb.AcquireLease(ctx, "stage/k1", ttl)
	var held *store.HeldError
	if !errors.As(err, &held) || held.Holder != "machine-a" || time.Until(held.Until) <= 0 || time.Until(held.Until) > ttl+2*time.Second {
		t.Fatalf("second acquire: %v", err)
	}
	// Renewed: still held well past its ttl.
	time.Sleep(ttl + ttl/2)
	if _, err := bb.AcquireLease(ctx, "stage/k1", ttl); !errors.Is(err, store.ErrLeaseHeld) {
		t.Fatalf("after 1.5 ttl of renewals: %v", err)
	}
	if err := la.Err(); err != nil {
		t.Fatalf("holder: %v", err)
	}
	// A waiter gets it as soon as it is released.
	waited := make(chan error, 1)
	var waits atomic.Int64
	go func() {
		l, err := bb.WaitLease(ctx, "stage/k1", ttl, ttl/10, func(*store.HeldError) { waits.Add(1) })
		if err == nil {
			if l.TakenFrom != "machine-a" {
				err = fmt.Errorf("taken from %q", l.TakenFrom)
			} else {
				err = l.Release(ctx)
			}
		}
		waited <- err
	}()
	time.Sleep(ttl / 4)
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(ttl):
		t.Fatal("the waiter did not get a released lease within ttl")
	}
	if waits.Load() == 0 {
		t.Error("the waiter never saw the lease held")
	}
	if err := la.Context().Err(); err == nil {
		t.Error("a released lease's context is not done")
	}
	if err := la.Err(); err != nil {
		t.Errorf("released lease: Err %v", err)
	}
}

// A holder that stops renewing (a machine that died) loses its lease
// once the storage's clock says ttl has passed; not before.
func testLeaseExpiry(t *testing.T, h Harness) {
	b := h.New(t)
	a, bb := open(t, b, "machine-a"), open(t, b, "machine-b")
	ttl := h.LeaseTTL
	actx, die := context.WithCancel(context.Background())
	for _, name := range []string{"stage/k2", "stage/k2b"} {
		if _, err := a.AcquireLease(actx, name, ttl); err != nil {
			t.Fatal(err)
		}
	}
	died := time.Now()
	die()
	ctx := context.Background()
	if _, err := bb.AcquireLease(ctx, "stage/k2", ttl); !errors.Is(err, store.ErrLeaseHeld) {
		t.Fatalf("acquire right after the holder died: %v", err)
	}
	l, err := bb.WaitLease(ctx, "stage/k2", ttl, ttl/10, nil)
	if err != nil {
		t.Fatal(err)
	}
	// S3 dates have whole seconds: the storage may judge up to one
	// second either way.
	if waited := time.Since(died); waited < ttl-time.Second || waited > 2*ttl+2*time.Second {
		t.Errorf("took over after %v, ttl %v", waited, ttl)
	}
	if l.TakenFrom != "machine-a" {
		t.Errorf("taken from %q", l.TakenFrom)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// 32 takers of another lease that expired with the first, at once:
	// one wins.
	racer := open(t, b, "racer")
	var wins atomic.Int64
	var wg, tried sync.WaitGroup
	start, raced := make(chan struct{}), make(chan struct{})
	for i := range racers {
		wg.Add(1)
		tried.Add(1)
		go func() {
			defer wg.Done()
			<-start
			l, err := racer.AcquireLease(ctx, "stage/k2b", time.Minute)
			tried.Done()
			switch {
			case err == nil:
				wins.Add(1)
				if l.TakenFrom != "machine-a" {
					t.Errorf("racer %d took it from %q", i, l.TakenFrom)
				}
				defer l.Release(ctx) // after every racer tried
				<-raced
			case !errors.Is(err, store.ErrLeaseHeld):
				t.Errorf("racer %d: %v", i, err)
			}
		}()
	}
	close(start)
	tried.Wait()
	close(raced)
	wg.Wait()
	if wins.Load() != 1 {
		t.Errorf("%d of %d racers took over the expired lease, want 1", wins.Load(), racers)
	}
}

// A holder whose lease is taken over (its version replaced) learns it at
// its next renewal: its context is cancelled with ErrLeaseLost.
func testLeaseLost(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	a := open(t, b, "machine-a")
	ttl := h.LeaseTTL
	l, err := a.AcquireLease(ctx, "stage/k3", ttl)
	if err != nil {
		t.Fatal(err)
	}
	// Another machine that judged it expired wrote its own lease.
	if _, err := b.Put(ctx, "leases/stage/k3", []byte(`{"holder":"machine-c","id":"x","ttl_ms":60000,"seq":0}`), store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Context().Done():
	case <-time.After(ttl):
		t.Fatal("the holder did not notice within ttl")
	}
	if err := l.Err(); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Err: %v", err)
	}
	if err := l.Release(ctx); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Release of a lost lease: %v", err)
	}
	li, _, ok, err := a.LeaseStatus(ctx, "stage/k3")
	if err != nil || !ok || li.Holder != "machine-c" {
		t.Errorf("the new holder's lease: %+v %v %v", li, ok, err)
	}
}

// resending is the backend behind a link that loses the answers of lease
// writes: each is applied, and then sent again (as the SDK's retries
// send a request whose answer did not come), and the second answer is
// the one the store gets: 412.
type resending struct {
	store.Backend
	resent atomic.Int64
	// lose: the next lease write is applied and its answer lost, not
	// sent again (an error, as a reset connection gives).
	lose, lost atomic.Bool
}

func (b *resending) Put(ctx context.Context, key string, body []byte, opt store.PutOptions) (store.Info, error) {
	in, err := b.Backend.Put(ctx, key, body, opt)
	if err != nil || !strings.HasPrefix(key, "leases/stage/") || !opt.IfNoneMatch && opt.IfMatch == "" {
		return in, err
	}
	if b.lose.CompareAndSwap(true, false) {
		b.lost.Store(true)
		return store.Info{}, errors.New("read tcp: connection reset by peer (the answer was lost)")
	}
	b.resent.Add(1)
	return b.Backend.Put(ctx, key, body, opt)
}

// A lease write that landed but whose answer was lost is the holder's,
// not a takeover: the acquisition holds the lease, renewals, Protect and
// Release go on.
func testLeaseAnswersLost(t *testing.T, h Harness) {
	ctx := context.Background()
	b := &resending{Backend: h.New(t)}
	a := open(t, b, "machine-a")
	other := open(t, b.Backend, "machine-b")
	// Each write here is three requests: room for them on a busy machine.
	ttl := max(h.LeaseTTL, 3*time.Second)
	l, err := a.AcquireLease(ctx, "stage/k4", ttl)
	if err != nil {
		t.Fatalf("acquire whose create was sent twice: %v", err)
	}
	if l.TakenFrom != "" {
		t.Errorf("taken from %q", l.TakenFrom)
	}
	// Two renewals, each sent twice.
	for deadline := time.Now().Add(3 * ttl); b.resent.Load() < 3 && time.Now().Before(deadline); {
		time.Sleep(ttl / 20)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("after renewals sent twice: %v", err)
	}
	if err := l.Protect(ctx, digest.Of([]byte("x"))); err != nil {
		t.Fatalf("protect sent twice: %v", err)
	}
	// A renewal that landed and whose answer never came, then Protect:
	// it goes on from the landed version, and what it protects is stored.
	b.lose.Store(true)
	for deadline := time.Now().Add(3 * ttl); !b.lost.Load() && time.Now().Before(deadline); {
		time.Sleep(ttl / 20)
	}
	y := digest.Of([]byte("y"))
	if err := l.Protect(ctx, y); err != nil {
		t.Fatalf("protect after a renewal whose answer was lost: %v", err)
	}
	if li, _, live, err := other.LeaseStatus(ctx, "stage/k4"); err != nil || !live || !slices.Contains(li.Blobs, y) {
		t.Fatalf("the lease after that protect: %+v live %v, %v", li, live, err)
	}
	// A blob protected again (stored early, then named with the rest of
	// its record) is named once.
	if err := l.Protect(ctx, y, digest.Of([]byte("x")), y); err != nil {
		t.Fatalf("protect again: %v", err)
	}
	if li, _, _, err := other.LeaseStatus(ctx, "stage/k4"); err != nil || len(li.Blobs) != 2 {
		t.Fatalf("the lease after protecting its blobs again names %v, want each of 2 once (%v)", li.Blobs, err)
	}
	if _, err := other.AcquireLease(ctx, "stage/k4", ttl); !errors.Is(err, store.ErrLeaseHeld) {
		t.Fatalf("another machine's acquire: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release sent twice: %v", err)
	}
	li, _, live, err := other.LeaseStatus(ctx, "stage/k4")
	if err != nil || live || !li.Released || li.Holder != "machine-a" {
		t.Errorf("after release: %+v live %v, %v", li, live, err)
	}
	if n := b.resent.Load(); n < 4 {
		t.Errorf("%d lease writes sent twice, want at least 4 (create, a renewal, protect, release)", n)
	}
	// A takeover sent twice holds the lease too.
	l2, err := a.AcquireLease(ctx, "stage/k4", ttl)
	if err != nil || l2.TakenFrom != "machine-a" {
		t.Fatalf("takeover of a released lease, sent twice: %v", err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A process killed holding a lease leaves it to expire for every other
// machine, but the next process with its cache (Options.ResumeLeases)
// takes it over at once; one interrupted (its context ended) releases it.
func testLeaseResume(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	cache := t.TempDir()
	resume := func(o *store.Options) { o.CacheDir, o.ResumeLeases = cache, true }
	const ttl = time.Minute // nothing here may wait for it
	first := open(t, b, "machine-a", resume)
	actx, die := context.WithCancel(ctx)
	if _, err := first.AcquireLease(actx, "stage/k5", ttl); err != nil {
		t.Fatal(err)
	}
	die()
	other := open(t, b, "machine-b")
	if _, err := other.AcquireLease(ctx, "stage/k5", ttl); !errors.Is(err, store.ErrLeaseHeld) {
		t.Fatalf("another machine's acquire of a dead holder's lease within its ttl: %v", err)
	}
	next := open(t, b, "machine-a", resume)
	l, err := next.AcquireLease(ctx, "stage/k5", ttl)
	if err != nil || l.Took != store.TookResumed || l.TakenFrom != "machine-a" {
		t.Fatalf("the next process with the cache: %+v, %v", l, err)
	}
	if _, err := next.AcquireLease(ctx, "stage/k5", ttl); !errors.Is(err, store.ErrLeaseHeld) {
		t.Fatalf("acquire of a lease the process holds: %v", err)
	}
	// Interrupted: the context ends, Release still gives it up.
	cctx, interrupt := context.WithCancel(ctx)
	l6, err := next.AcquireLease(cctx, "stage/k6", ttl)
	if err != nil {
		t.Fatal(err)
	}
	interrupt()
	<-l6.Context().Done()
	if err := l6.Release(ctx); err != nil {
		t.Fatalf("release after the context ended: %v", err)
	}
	l7, err := other.AcquireLease(ctx, "stage/k6", ttl)
	if err != nil || l7.Took != store.TookReleased || l7.TakenFrom != "machine-a" {
		t.Fatalf("acquire after an interrupted holder released: %+v, %v", l7, err)
	}
	for _, l := range []*store.Lease{l, l7} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(cache, "leases", "*")); len(m) != 0 {
		t.Errorf("lease journals left after release: %v", m)
	}
}

// listHook runs fn (once) when the blobs are listed: gc has read the
// leases and records by then.
type listHook struct {
	store.Backend
	once sync.Once
	fn   func()
}

func (b *listHook) List(ctx context.Context, prefix string, fn func(store.Info) error) error {
	if prefix == "blobs/" {
		b.once.Do(b.fn)
	}
	return b.Backend.List(ctx, prefix, fn)
}

// A writer that reuses a stored blob no record names while gc runs: gc
// has read the leases and records before the writer protects the blob,
// and deletes it; the writer, having protected it, waits for gc to end
// before it looks for the blob, stores it again and commits its record.
// No record names a blob that is gone.
func testGCWhileReusing(t *testing.T, h Harness) {
	ctx := context.Background()
	raw := h.New(t)
	w := open(t, raw, "writer")
	data := []byte("made by a run whose record was dropped\n")
	d := putBlob(t, w, data)
	grace := 500 * time.Millisecond
	waitOlder(t, raw, store.BlobKey(d), grace)
	wrote := make(chan error, 1)
	b := &listHook{Backend: raw}
	b.fn = func() {
		l, err := w.AcquireLease(ctx, "stage/reuse", h.LeaseTTL)
		if err != nil {
			wrote <- err
			return
		}
		protected := make(chan struct{})
		go func() {
			// The protection is written before Protect waits for gc.
			for {
				li, _, _, err := w.LeaseStatus(ctx, "stage/reuse")
				if err == nil && slices.Contains(li.Blobs, d) {
					close(protected)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
		go func() {
			err := func() error {
				if err := l.Protect(ctx, d); err != nil {
					return err
				}
				if _, there, err := w.HasBlob(ctx, d); err != nil || there {
					return cmp.Or(err, errors.New("the blob gc deleted is still there after Protect"))
				}
				if err := w.PutBlob(ctx, d, bytes.NewReader(data), int64(len(data)), nil); err != nil {
					return err
				}
				_, err := w.CommitRecord(ctx, &store.Record{Key: "reuse", Outputs: []store.Output{{Path: "x", Digest: d, Size: int64(len(data))}}})
				return err
			}()
			wrote <- cmp.Or(err, l.Release(ctx))
		}()
		<-protected
	}
	g := open(t, b, "gc")
	rep, err := g.GC(ctx, store.GCOptions{Grace: grace})
	if err != nil {
		t.Fatal(err)
	}
	if rep.RemovedBlobs != 1 {
		t.Errorf("gc removed %d blobs, want 1 (it read the leases before the writer's protection): %+v", rep.RemovedBlobs, rep)
	}
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the writer did not finish")
	}
	if _, ok, err := w.HasBlob(ctx, d); !ok || err != nil {
		t.Fatalf("record committed, its blob stored %v (%v)", ok, err)
	}
	vr, err := w.Verify(ctx, nil)
	if err != nil || !vr.OK() {
		t.Errorf("verify: %+v, %v", vr, err)
	}
}

// waitOlder waits until key is older than age by the storage's clock,
// whose dates may have whole seconds and lag on a loaded machine (a
// server's cached Date header).
func waitOlder(t *testing.T, b store.Backend, key string, age time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		in, err := b.Head(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if in.Date.Sub(in.Modified) > age {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is not older than %v by the storage's clock after 30 s: %+v", key, age, in)
		}
	}
}

// A lease that does not parse may have protected blobs gc cannot name:
// gc stops (bad data, exit 3) while it is within the grace period, and
// once it is older treats it as gone (and removes it).
func testGCUnreadableLease(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	s := open(t, b, "a")
	d := putBlob(t, s, []byte("stored by a stage whose lease is garbled\n"))
	if _, err := b.Put(ctx, "leases/stage/garbled", []byte(`{"holder":"mac`), store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := s.GC(ctx, store.GCOptions{Grace: time.Hour})
	if !errors.Is(err, store.ErrGCUnsure) || errkind.Of(err) != errkind.VerifyFailed || !strings.Contains(err.Error(), "lease stage/garbled does not parse") {
		t.Fatalf("gc with a young unreadable lease: %v", err)
	}
	if _, ok, err := s.HasBlob(ctx, d); !ok || err != nil {
		t.Fatalf("gc that stopped removed a blob (%v)", err)
	}
	// Once older than the default grace period (and the one asked for),
	// it protects nothing: here the lease and the blob are made an hour
	// old.
	for _, k := range []string{"leases/stage/garbled", store.BlobKey(d)} {
		h.Age(t, b, k, time.Hour+time.Minute)
	}
	rep, err := s.GC(ctx, store.GCOptions{Grace: time.Second})
	if err != nil || rep.RemovedBlobs != 1 || rep.RemovedLeases != 1 {
		t.Fatalf("gc once the unreadable lease is old: %+v, %v", rep, err)
	}
}

// gc with PruneRecords drops the records no ref names, older than the
// grace period and whose stage no live lease is making; the blobs only
// they named go with them. A dry run counts the same and removes nothing.
func testGCPruneRecords(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	s := open(t, b, "a")
	commit := func(key, body string) digest.Digest {
		t.Helper()
		d := putBlob(t, s, []byte(body))
		if _, err := s.CommitRecord(ctx, &store.Record{Key: key, Outputs: []store.Output{{Path: "o", Digest: d, Size: int64(len(body))}}}); err != nil {
			t.Fatal(err)
		}
		return d
	}
	current := commit("current", "the stage's latest\n")
	if err := s.PointRef(ctx, "pipelines/p/s", "current"); err != nil {
		t.Fatal(err)
	}
	earlier := commit("earlier", "an earlier parameter's\n")
	making := commit("making", "a stage a machine is making again (forced)\n")
	l, err := s.AcquireLease(ctx, "stage/making", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	grace := time.Hour
	for _, k := range []string{"records/earlier.json", store.BlobKey(earlier), "records/making.json", store.BlobKey(making), "records/current.json", store.BlobKey(current)} {
		h.Age(t, b, k, 2*grace)
	}
	young := commit("young", "committed, its ref not pointed yet\n")
	for _, dry := range []bool{true, false} {
		rep, err := s.GC(ctx, store.GCOptions{Grace: grace, PruneRecords: true, DryRun: dry})
		if err != nil {
			t.Fatal(err)
		}
		if rep.PrunedRecords != 1 || rep.RemovedBlobs != 1 || rep.Records != 4 {
			t.Errorf("dry run %v: %+v, want 1 record pruned and its blob removed", dry, rep)
		}
	}
	for key, want := range map[string]bool{"current": true, "earlier": false, "making": true, "young": true} {
		if _, err := s.Record(ctx, key); (err == nil) != want {
			t.Errorf("record %s after prune: %v, want kept %v", key, err, want)
		}
	}
	for d, want := range map[digest.Digest]bool{current: true, earlier: false, making: true, young: true} {
		if _, ok, err := s.HasBlob(ctx, d); ok != want || err != nil {
			t.Errorf("blob %s after prune: stored %v (%v), want %v", d.Short(), ok, err, want)
		}
	}
	if vr, err := s.Verify(ctx, nil); err != nil || !vr.OK() {
		t.Errorf("verify after prune: %+v, %v", vr, err)
	}
}

// A lease removed behind its holder (gc removes an expired one) is lost
// at the next renewal, and the error says it was removed, not taken over.
func testLeaseRemoved(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	s := open(t, b, "a")
	l, err := s.AcquireLease(ctx, "stage/k", h.LeaseTTL)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if err := b.Delete(ctx, "leases/stage/k", ""); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Context().Done():
	case <-time.After(2*h.LeaseTTL + 5*time.Second):
		t.Fatal("the holder did not notice its lease was removed")
	}
	if err := l.Err(); !errors.Is(err, store.ErrLeaseLost) || !strings.Contains(err.Error(), "removed once it had expired") {
		t.Errorf("lease removed: %v", err)
	}
}

// A lease's marks: a machine that cannot name a lease finds it by its
// group while it is live (the holder now, its note), not a nested group's;
// Release removes them; a holder that died leaves its mark, which counts
// only while its lease does, is replaced by the next holder's, and goes
// in a gc past the grace period, with any other object there that is
// not a mark, while a live lease's stays.
func testMarks(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	a, bb := open(t, b, "machine-a"), open(t, b, "machine-b")
	ttl := h.LeaseTTL
	const group = "pipelines/p/merged"
	marked := func(s *store.Store, g string) []store.Mark {
		t.Helper()
		ms, err := s.Marked(ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		return ms
	}
	if ms := marked(bb, group); len(ms) != 0 {
		t.Fatalf("marks of an empty store: %+v", ms)
	}
	l1, err := a.AcquireLease(ctx, "stage/m1", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := l1.Mark(ctx, group, json.RawMessage(`{"params":1}`)); err != nil {
		t.Fatal(err)
	}
	// Marked again with another note: one mark, the last note.
	if err := l1.Mark(ctx, group, json.RawMessage(`{"params":2}`)); err != nil {
		t.Fatal(err)
	}
	l2, err := a.AcquireLease(ctx, "stage/m2", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Mark(ctx, group+"/nested", nil); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "a//b", "../x", "a b"} {
		if err := l2.Mark(ctx, bad, nil); err == nil {
			t.Errorf("Mark in group %q: no error", bad)
		}
		if _, err := bb.Marked(ctx, bad); err == nil {
			t.Errorf("Marked of group %q: no error", bad)
		}
	}
	if err := l2.Mark(ctx, group, json.RawMessage(`{"params":`)); err == nil {
		t.Error("Mark with a note that is not JSON: no error")
	}
	ms := marked(bb, group)
	if len(ms) != 1 || ms[0].Lease != "stage/m1" || ms[0].Holder != "machine-a" || string(ms[0].Note) != `{"params":2}` || time.Until(ms[0].Until) <= 0 || time.Until(ms[0].Until) > ttl+2*time.Second {
		t.Fatalf("marks of %s: %+v", group, ms)
	}
	if ms := marked(bb, group+"/nested"); len(ms) != 1 || ms[0].Lease != "stage/m2" || ms[0].Note != nil {
		t.Fatalf("marks of the nested group: %+v", ms)
	}
	// A lease marking two groups, unmarked in one: the other stays, and
	// unmarking a group it never marked does nothing.
	lt, err := a.AcquireLease(ctx, "run/r3", ttl)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{group + "/x", group + "/y"} {
		if err := lt.Mark(ctx, g, json.RawMessage(`{"pending":true}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := lt.Unmark(ctx, group+"/x"); err != nil {
		t.Fatal(err)
	}
	if err := lt.Unmark(ctx, group+"/z"); err != nil {
		t.Fatalf("unmark of a group never marked: %v", err)
	}
	if ms := marked(bb, group+"/x"); len(ms) != 0 {
		t.Fatalf("marks of a group unmarked: %+v", ms)
	}
	if ms := marked(bb, group+"/y"); len(ms) != 1 || ms[0].Lease != "run/r3" {
		t.Fatalf("marks of the group still marked: %+v", ms)
	}
	if err := lt.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if ms := marked(bb, group+"/y"); len(ms) != 0 {
		t.Fatalf("marks after the release of the lease marking two groups: %+v", ms)
	}
	objects := func(prefix string) int {
		t.Helper()
		n := 0
		if err := b.List(ctx, prefix, func(store.Info) error { n++; return nil }); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Released: its mark is gone, not only ignored.
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if ms := marked(bb, group); len(ms) != 0 {
		t.Fatalf("marks after the release: %+v", ms)
	}
	if n := objects("marks/" + group + "/"); n != 1 {
		t.Fatalf("%d objects under the group's prefix after the release, want the nested group's 1", n)
	}

	// A holder that dies: its mark counts while its lease lives, then not.
	actx, die := context.WithCancel(ctx)
	l3, err := a.AcquireLease(actx, "stage/m3", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := l3.Mark(ctx, group, json.RawMessage(`"a's"`)); err != nil {
		t.Fatal(err)
	}
	die()
	if ms := marked(bb, group); len(ms) != 1 || ms[0].Lease != "stage/m3" {
		t.Fatalf("marks right after the holder died: %+v", ms)
	}
	deadline := time.Now().Add(2*ttl + 5*time.Second)
	for len(marked(bb, group)) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the dead holder's mark still counts after %v (ttl %v)", 2*ttl+5*time.Second, ttl)
		}
		time.Sleep(ttl / 10)
	}
	// The next holder: the mark left counts not for it (another
	// acquisition's), and its own mark replaces it.
	l4, err := bb.WaitLease(ctx, "stage/m3", ttl, ttl/10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ms := marked(a, group); len(ms) != 0 {
		t.Fatalf("the dead holder's mark counts for the lease's next holder: %+v", ms)
	}
	if err := l4.Mark(ctx, group, json.RawMessage(`"b's"`)); err != nil {
		t.Fatal(err)
	}
	if ms := marked(a, group); len(ms) != 1 || ms[0].Holder != "machine-b" || string(ms[0].Note) != `"b's"` {
		t.Fatalf("marks after the takeover: %+v", ms)
	}
	if err := l4.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := objects("marks/" + group + "/"); n != 1 {
		t.Fatalf("%d objects under the group's prefix after the takeover's release, want 1", n)
	}

	// The same machine taking a lease again writes a mark of other bytes:
	// a delete conditional on the version of its mark before (a gc that
	// read it, a holder that lost the lease releasing late) is refused.
	const again = group + "-again"
	actx, die = context.WithCancel(ctx)
	l6, err := a.AcquireLease(actx, "stage/m6", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := l6.Mark(ctx, again, json.RawMessage(`"same"`)); err != nil {
		t.Fatal(err)
	}
	var first store.Info
	if err := b.List(ctx, "marks/"+again+"/", func(in store.Info) error { first = in; return nil }); err != nil || first.Key == "" {
		t.Fatalf("the mark's object: %+v, %v", first, err)
	}
	first, err = b.Head(ctx, first.Key)
	if err != nil {
		t.Fatal(err)
	}
	die()
	l7, err := a.WaitLease(ctx, "stage/m6", ttl, ttl/10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l7.Mark(ctx, again, json.RawMessage(`"same"`)); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(ctx, first.Key, first.ETag); !errors.Is(err, store.ErrPrecondition) {
		t.Fatalf("a delete conditional on the earlier acquisition's mark: %v, want refused", err)
	}
	if ms := marked(bb, again); len(ms) != 1 || ms[0].Holder != "machine-a" {
		t.Fatalf("marks of the lease taken again: %+v", ms)
	}
	if err := l7.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// An object under the group too large to be a mark is none.
	if _, err := b.Put(ctx, "marks/"+again+"/large", make([]byte, 300<<10), store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if ms := marked(bb, again); len(ms) != 0 {
		t.Fatalf("marks with a large object there: %+v", ms)
	}
	if err := b.Delete(ctx, "marks/"+again+"/large", ""); err != nil {
		t.Fatal(err)
	}

	// gc: a mark left by a holder that died (another process, here its
	// lease gone), and an object that is no mark, both past the grace
	// period, go; the live lease's mark stays, however old.
	actx, die = context.WithCancel(ctx)
	l5, err := a.AcquireLease(actx, "stage/m5", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := l5.Mark(ctx, group, nil); err != nil {
		t.Fatal(err)
	}
	die()
	if err := b.Delete(ctx, "leases/stage/m5", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Put(ctx, "marks/"+group+"/garbled", []byte("{"), store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	var keys []string
	if err := b.List(ctx, "marks/", func(in store.Info) error { keys = append(keys, in.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 3 {
		t.Fatalf("mark objects before gc: %v", keys)
	}
	if ms := marked(bb, group); len(ms) != 0 {
		t.Fatalf("marks of a removed lease, or of an object that is none: %+v", ms)
	}
	rep, err := bb.GC(ctx, store.GCOptions{Grace: time.Hour})
	if err != nil || rep.RemovedMarks != 0 {
		t.Fatalf("gc within the grace period: %+v, %v", rep, err)
	}
	for _, k := range keys {
		h.Age(t, b, k, 2*time.Hour)
	}
	rep, err = bb.GC(ctx, store.GCOptions{Grace: time.Hour, DryRun: true})
	if err != nil || rep.RemovedMarks != 2 || objects("marks/") != 3 {
		t.Fatalf("gc dry run: %+v, %v", rep, err)
	}
	rep, err = bb.GC(ctx, store.GCOptions{Grace: time.Hour})
	if err != nil || rep.RemovedMarks != 2 {
		t.Fatalf("gc: %+v, %v", rep, err)
	}
	if ms := marked(bb, group+"/nested"); len(ms) != 1 || objects("marks/") != 1 {
		t.Fatalf("after gc: the live lease's mark %+v, %d mark objects, want it alone", ms, objects("marks/"))
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := objects("marks/"); n != 0 {
		t.Fatalf("%d mark objects after every lease was released", n)
	}
}

// A blob removed while it is fetched (a gc, a prune between its HEAD and
// its reads) is missing, as one removed before: its record's stage is
// made again, not failed on a raw "no such object".
func testFetchBlobRemoved(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	s := open(t, b, "a")
	d := putBlob(t, s, multipartData(3))
	gone := &removingReads{Backend: b}
	f := open(t, gone, "b")
	err := f.FetchBlob(ctx, d, filepath.Join(t.TempDir(), "blob"), nil)
	if !errors.Is(err, store.ErrBlobMissing) {
		t.Fatalf("fetch of a blob removed mid-way: %v", err)
	}
}

// removingReads removes each key just before its first ranged read.
type removingReads struct {
	store.Backend
	once sync.Once
}

func (b *removingReads) GetRange(ctx context.Context, key string, off int64, buf []byte) error {
	b.once.Do(func() { b.Backend.Delete(ctx, key, "") })
	return b.Backend.GetRange(ctx, key, off, buf)
}

// sameSet reports whether a and b hold the same strings, in any order.
func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func putBlob(t *testing.T, s *store.Store, data []byte) digest.Digest {
	t.Helper()
	d := digest.Of(data)
	if err := s.PutBlob(context.Background(), d, bytes.NewReader(data), int64(len(data)), nil); err != nil {
		t.Fatal(err)
	}
	return d
}

// verify re-hashes what the storage returns and finds a damaged blob and
// a record whose blob is gone.
func testVerify(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	s := open(t, b, "a")
	small, big := []byte("first output\n"), multipartData(6)
	d1, d2 := putBlob(t, s, small), putBlob(t, s, big)
	d3 := putBlob(t, s, []byte("unreferenced\n"))
	rec := &store.Record{Key: "k", Outputs: []store.Output{{Path: "a", Digest: d1, Size: int64(len(small))}, {Path: "b", Digest: d2, Size: int64(len(big))}}}
	if _, err := s.CommitRecord(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := s.PointRef(ctx, "pipelines/p/s", "k"); err != nil {
		t.Fatal(err)
	}
	var hashed int64
	rep, err := s.Verify(ctx, func(n int64) { hashed += n })
	if err != nil || !rep.OK() || rep.Blobs != 3 || rep.Records != 1 || rep.Unreferenced != 1 {
		t.Fatalf("verify: %+v, %v", rep, err)
	}
	if want := int64(len(small) + len(big) + len("unreferenced\n")); hashed != want || rep.Bytes != want {
		t.Errorf("re-hashed %d bytes, report %d, want %d", hashed, rep.Bytes, want)
	}
	h.Damage(t, b, store.BlobKey(d2))
	if err := b.Delete(ctx, store.BlobKey(d1), ""); err != nil {
		t.Fatal(err)
	}
	rep, err = s.Verify(ctx, nil)
	if err != nil || rep.OK() || len(rep.Problems) != 2 {
		t.Fatalf("verify of a damaged store: %+v, %v", rep, err)
	}
	var damaged, missing bool
	for _, p := range rep.Problems {
		// The damaged blob names the record and ref it breaks.
		damaged = damaged || p.Blob == d2 && p.Record == "" && strings.Contains(p.What, "hash to") &&
			slices.Equal(p.Records, []string{"k"}) && slices.Equal(p.Refs, []string{"pipelines/p/s"}) && !p.Removed
		missing = missing || p.Blob == d1 && p.Record == "k" && strings.Contains(p.What, "blob missing")
	}
	if !damaged || !missing {
		t.Errorf("problems: %+v", rep.Problems)
	}
	if _, ok, err := s.HasBlob(ctx, d2); err != nil || !ok {
		t.Fatalf("verify without Repair removed the damaged blob (%v)", err)
	}
	// Repair removes the damaged blob (and only it): the record then
	// names a missing blob, which a run makes and stores again.
	rep, err = s.VerifyWith(ctx, store.VerifyOptions{Repair: true})
	if err != nil || rep.OK() {
		t.Fatalf("verify --repair: %+v, %v", rep, err)
	}
	var removed int
	for _, p := range rep.Problems {
		if p.Removed {
			removed++
			if p.Blob != d2 {
				t.Errorf("repair removed blob %s, not the damaged %s", p.Blob, d2)
			}
		}
	}
	if removed != 1 {
		t.Errorf("repair removed %d blobs, want 1: %+v", removed, rep.Problems)
	}
	if _, ok, err := s.HasBlob(ctx, d2); err != nil || ok {
		t.Fatalf("the damaged blob is still there after repair (%v)", err)
	}
	if _, ok, err := s.HasBlob(ctx, d3); err != nil || !ok {
		t.Fatalf("repair removed a whole blob (%v)", err)
	}
	rep, err = s.Verify(ctx, nil)
	if err != nil || len(rep.Problems) != 2 {
		t.Fatalf("verify after repair: %+v, %v", rep, err)
	}
	for _, p := range rep.Problems {
		if p.Record != "k" || !errors.Is(p.Err, store.ErrBlobMissing) {
			t.Errorf("after repair: %+v, want record k's two blobs missing", p)
		}
	}
	if err := s.PutBlob(ctx, d2, bytes.NewReader(big), int64(len(big)), nil); err != nil {
		t.Fatalf("storing the removed blob again: %v", err)
	}
	if got, _, err := s.HashBlob(ctx, d2, nil); err != nil || got != d2 {
		t.Fatalf("the blob stored again hashes to %s (%v)", got, err)
	}
	// Bytes damaged on their way here, whole where they are stored: the
	// first read is reported, and Repair, which hashes again before it
	// removes, removes nothing.
	dr := open(t, &damagingReads{Backend: b, read: map[string]bool{}}, "b")
	rep, err = dr.VerifyWith(ctx, store.VerifyOptions{Repair: true})
	if err != nil {
		t.Fatal(err)
	}
	var reported int
	for _, p := range rep.Problems {
		if errors.Is(p.Err, store.ErrDigestMismatch) {
			reported++
			if p.Removed || !strings.Contains(p.What, "not removed: hashed again, it is whole") {
				t.Errorf("a read damaged in transit: %+v", p)
			}
		}
	}
	if reported != 2 { // d2 and d3 (d1 is gone)
		t.Errorf("%d damaged reads reported, want 2: %+v", reported, rep.Problems)
	}
	for _, d := range []digest.Digest{d2, d3} {
		if _, ok, err := s.HasBlob(ctx, d); err != nil || !ok {
			t.Errorf("repair removed whole blob %s after a damaged read (%v)", d, err)
		}
	}
}

// verify reports a ref that names no record the store holds, or holds
// no record key; RefRecord says so with ErrRefBroken (bad data, exit 3).
func testVerifyRefs(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	s := open(t, b, "a")
	data := []byte("output\n")
	d := putBlob(t, s, data)
	if _, err := s.CommitRecord(ctx, &store.Record{Key: "k", Outputs: []store.Output{{Path: "o", Digest: d, Size: int64(len(data))}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.PointRef(ctx, "pipelines/p/good", "k"); err != nil {
		t.Fatal(err)
	}
	if err := s.PointRef(ctx, "pipelines/p/gone", "no-such-record"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Put(ctx, "refs/pipelines/p/garbage", []byte("not a key!\n"), store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	rep, err := s.Verify(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, p := range rep.Problems {
		got[p.Ref] = p.What
	}
	if len(rep.Problems) != 2 || !strings.Contains(got["pipelines/p/gone"], "names record no-such-record, which is not in the store") ||
		!strings.Contains(got["pipelines/p/garbage"], `holds "not a key!", not a record key`) {
		t.Errorf("verify: %+v", rep.Problems)
	}
	for name, want := range map[string]error{"pipelines/p/good": nil, "pipelines/p/gone": store.ErrRefBroken, "pipelines/p/garbage": store.ErrRefBroken} {
		ref, err := s.GetRef(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		r, err := s.RefRecord(ctx, ref)
		if !errors.Is(err, want) || want == nil && r.Key != "k" || want != nil && errkind.Of(err) != errkind.VerifyFailed {
			t.Errorf("RefRecord of %s: %v, %v", name, r, err)
		}
	}
}

// damagingReads damages the first ranged read of each key on its way:
// the stored bytes stay whole.
type damagingReads struct {
	store.Backend
	mu   sync.Mutex
	read map[string]bool
}

func (b *damagingReads) GetRange(ctx context.Context, key string, off int64, buf []byte) error {
	if err := b.Backend.GetRange(ctx, key, off, buf); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.read[key] && len(buf) > 0 {
		b.read[key] = true
		buf[0] ^= 0xff
	}
	return nil
}

// gc removes only blobs no record names, no live lease protects and that
// are older than the grace period; and unfinished uploads past it.
func testGC(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	s := open(t, b, "a")
	maker := open(t, b, "maker")
	referenced := putBlob(t, s, []byte("named by a record\n"))
	if _, err := s.CommitRecord(ctx, &store.Record{Key: "k", Outputs: []store.Output{{Path: "x", Digest: referenced, Size: 18}}}); err != nil {
		t.Fatal(err)
	}
	live, err := maker.AcquireLease(ctx, "stage/making", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Release(ctx)
	leased := putBlob(t, maker, []byte("being made, no record yet\n"))
	if err := live.Protect(ctx, leased); err != nil {
		t.Fatal(err)
	}
	done, err := maker.AcquireLease(ctx, "stage/done", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	released := putBlob(t, maker, []byte("made by a stage that gave up\n"))
	if err := done.Protect(ctx, released); err != nil {
		t.Fatal(err)
	}
	if err := done.Release(ctx); err != nil {
		t.Fatal(err)
	}
	garbage := putBlob(t, s, []byte("garbage\n"))
	if _, err := b.CreateUpload(ctx, store.BlobKey(digest.Of([]byte("abandoned")))); err != nil {
		t.Fatal(err)
	}
	// An upload the live lease protects is going on, however old.
	inflight := digest.Of([]byte("a long upload"))
	if err := live.Protect(ctx, inflight); err != nil {
		t.Fatal(err)
	}
	inflightID, err := b.CreateUpload(ctx, store.BlobKey(inflight))
	if err != nil {
		t.Fatal(err)
	}
	// Another tool's upload under the store's prefix (`ferry transfer`,
	// aws s3 cp into the same bucket) is not the store's: never aborted,
	// however old. A probe killed mid-way left a scratch object and an
	// upload: the store's, removed past the grace period.
	foreignID, err := b.CreateUpload(ctx, "exports/model.gguf")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateUpload(ctx, "probe/killed/multipart"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Put(ctx, "probe/killed/a", []byte("probe 1\n"), store.PutOptions{}); err != nil {
		t.Fatal(err)
	}

	// Within the grace period nothing goes.
	rep, err := s.GC(ctx, store.GCOptions{Grace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if rep.RemovedBlobs != 0 || rep.KeptBlobs != 1 || rep.KeptLeased != 1 || rep.KeptYoung != 2 || rep.AbortedUploads != 0 || len(rep.Leases) != 1 || rep.RemovedLeases != 0 || rep.RemovedScratch != 0 {
		t.Fatalf("gc within the grace period: %+v", rep)
	}
	if u, err := s.DiskUsage(ctx); err != nil || u.Uploads != 3 {
		t.Errorf("du counts %d unfinished uploads, want 3: the store's two and the probe's (%v)", u.Uploads, err)
	}
	// Past the grace period by the storage's clock, whose dates may have
	// whole seconds and lag (a server's cached Date header).
	grace := h.LeaseTTL / 4
	time.Sleep(grace + h.LeaseTTL)
	rep, err = s.GC(ctx, store.GCOptions{Grace: grace, DryRun: true})
	if err != nil || rep.RemovedBlobs != 2 {
		t.Fatalf("dry run: %+v, %v", rep, err)
	}
	rep, err = s.GC(ctx, store.GCOptions{Grace: grace})
	if err != nil {
		t.Fatal(err)
	}
	if rep.RemovedBlobs != 2 || rep.KeptBlobs != 1 || rep.KeptLeased != 1 || rep.AbortedUploads != 2 || rep.Leases[0].Name != "stage/making" || rep.RemovedLeases != 1 || rep.RemovedScratch != 1 {
		t.Fatalf("gc: %+v", rep)
	}
	if _, err := b.Head(ctx, "probe/killed/a"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the killed probe's scratch object after gc: %v", err)
	}
	if _, _, _, err := s.LeaseStatus(ctx, "stage/done"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the released lease is still there: %v", err)
	}
	if _, _, ok, err := s.LeaseStatus(ctx, "stage/making"); !ok || err != nil {
		t.Errorf("the live lease: %v %v", ok, err)
	}
	for d, want := range map[digest.Digest]bool{referenced: true, leased: true, released: false, garbage: false} {
		if _, ok, err := s.HasBlob(ctx, d); ok != want || err != nil {
			t.Errorf("blob %s: stored %v (%v), want %v", d.Short(), ok, err, want)
		}
	}
	var uploads []string
	if err := b.ListUploads(ctx, "", func(u store.Upload) error { uploads = append(uploads, u.ID); return nil }); err != nil || !sameSet(uploads, []string{inflightID, foreignID}) {
		t.Errorf("uploads after gc: %v (%v), want the protected one and the other tool's", uploads, err)
	}
	if err := b.AbortUpload(ctx, store.BlobKey(inflight), inflightID); err != nil {
		t.Fatal(err)
	}
	if err := b.AbortUpload(ctx, "exports/model.gguf", foreignID); err != nil {
		t.Fatal(err)
	}
	noUploads(t, b)
	if _, err := s.SetRef(ctx, "pipelines/p/x", "k", nil); err != nil {
		t.Fatal(err)
	}
	u, err := s.DiskUsage(ctx)
	if err != nil || u.Blobs != 2 || u.Records != 1 || u.UnreferencedBlobs != 1 || u.MissingBlobs != 0 || len(u.Leases) != 1 || u.Leases[0].Holder != "maker" {
		t.Errorf("du: %+v, %v", u, err)
	}
	if len(u.ByRecord) != 1 || u.ByRecord[0].Key != "k" || u.ByRecord[0].Bytes != 18 || u.ByRecord[0].Host != "a" || !slices.Equal(u.ByRecord[0].Refs, []string{"pipelines/p/x"}) {
		t.Errorf("du by record: %+v", u.ByRecord)
	}
}

// PutFile stores a file (through a backend's fast path where it has one)
// only when its bytes are the digest's, and fetches back the same bytes.
func testPutFile(t *testing.T, h Harness) {
	ctx := context.Background()
	s := open(t, h.New(t), "a")
	dir := t.TempDir()
	for _, data := range [][]byte{[]byte("a file\n"), multipartData(7)} {
		p := filepath.Join(dir, "f")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		d := digest.Of(data)
		if err := s.PutFile(ctx, digest.Of([]byte("other")), p, nil); !errors.Is(err, store.ErrDigestMismatch) {
			t.Errorf("%d bytes under another digest: %v", len(data), err)
		}
		if _, ok, _ := s.HasBlob(ctx, digest.Of([]byte("other"))); ok {
			t.Fatal("stored under a digest that is not its bytes'")
		}
		var reported int64
		if err := s.PutFile(ctx, d, p, func(n int64) { reported += n }); err != nil {
			t.Fatal(err)
		}
		if reported != int64(len(data)) {
			t.Errorf("progress: %d of %d bytes", reported, len(data))
		}
		if err := s.PutFile(ctx, d, p, nil); err != nil {
			t.Errorf("again: %v", err)
		}
		out := filepath.Join(dir, "out")
		os.Remove(out)
		if err := s.FetchBlob(ctx, d, out, nil); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
			t.Errorf("%d bytes: fetched bytes differ", len(data))
		}
	}
}

// PutKnownFile stores a file the caller vouches for without hashing it
// whole: each part is still checked by the storage, a source found changed
// before completion drops the upload, and a killed upload resumes from
// the parts the storage holds. (The counting wrapper hides a backend's
// FilePutter, so every backend takes the multipart path here.)
func testPutKnownFile(t *testing.T, h Harness) {
	ctx := context.Background()
	b := &counting{Backend: h.New(t)}
	cache := t.TempDir()
	s := open(t, b, "a", func(o *store.Options) { o.CacheDir = cache; o.Parallel = 1 })
	dir := t.TempDir()
	data := multipartData(8)
	nparts := int64((len(data) + partSize - 1) / partSize)
	d := digest.Of(data)
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	ok := func() error { return nil }

	// Changed before it completes: no blob, no upload left.
	changed := func() error { return errors.New("mtime differs") }
	if err := s.PutKnownFile(ctx, d, p, changed, nil); !errors.Is(err, store.ErrDigestMismatch) {
		t.Fatalf("a source found changed: %v", err)
	}
	if _, ok, _ := s.HasBlob(ctx, d); ok {
		t.Fatal("a source found changed became a blob")
	}
	noUploads(t, b)

	// Killed after two parts, then resumed: each part stored once.
	b.parts.Store(0)
	kctx, cancel := context.WithCancel(ctx)
	var done int64
	err := s.PutKnownFile(kctx, d, p, ok, func(n int64) {
		if done += n; done >= 2*partSize {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("killed upload: %v", err)
	}
	first := b.parts.Load()
	var resumed int64
	if err := s.PutKnownFile(ctx, d, p, ok, func(n int64) { resumed += n }); err != nil {
		t.Fatal(err)
	}
	if total := b.parts.Load(); total != nparts || first < 2 {
		t.Errorf("parts stored: %d before the kill + %d after, want %d in all (each once)", first, total-first, nparts)
	}
	if resumed != int64(len(data)) {
		t.Errorf("resume reported %d of %d bytes", resumed, len(data))
	}
	// Stored: again is success, and the bytes are whole.
	if err := s.PutKnownFile(ctx, d, p, ok, nil); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	if err := s.FetchBlob(ctx, d, out, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
		t.Error("fetched bytes differ")
	}
	noUploads(t, b)
	if m, _ := filepath.Glob(filepath.Join(cache, "uploads", "*", "*")); len(m) != 0 {
		t.Errorf("journal left: %v", m)
	}
}

// Four goroutines of one machine storing the same multipart blob at once
// (two stages that make the same bytes), and four fetching it to one
// file: all succeed, one upload is made, the bytes are whole.
func testSameBlobAtOnce(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	s := open(t, b, "a")
	data := multipartData(8)
	d := digest.Of(data)
	dst := filepath.Join(t.TempDir(), "out")
	for _, do := range []func() error{
		func() error { return s.PutBlob(ctx, d, bytes.NewReader(data), int64(len(data)), nil) },
		func() error { return s.FetchBlob(ctx, d, dst, nil) },
	} {
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			wg.Add(1)
			go func() { defer wg.Done(); errs <- do() }()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, data) {
		t.Fatal("fetched bytes differ")
	}
	noUploads(t, b)
	if m, _ := filepath.Glob(dst + ".*"); len(m) != 0 {
		t.Errorf("left behind: %v", m)
	}
}

// What a machine's cache on the same store adds to verify and gc (a
// pipeline directory is both): records kept outside the store (its
// imports) checked and their blobs kept, blobs hashed side by side and
// each reported, and a gc under the store's exclusive lock (no grace, no
// lease) telling of each blob it removes.
func testMaintainWithCache(t *testing.T, h Harness) {
	ctx := context.Background()
	b := h.New(t)
	s := open(t, b, "a")
	var blobs []digest.Digest
	for i := range 5 {
		blobs = append(blobs, putBlob(t, s, []byte(fmt.Sprintf("blob %d\n", i))))
	}
	const size = int64(len("blob 0\n"))
	if _, err := s.CommitRecord(ctx, &store.Record{Key: "k", Outputs: []store.Output{{Path: "x", Digest: blobs[0], Size: size}}}); err != nil {
		t.Fatal(err)
	}
	missing := digest.Of([]byte("never stored"))
	also := []*store.Record{
		{Key: "import", Outputs: []store.Output{{Path: "w", Digest: blobs[1], Size: size}}},
		{Key: "import-gone", Outputs: []store.Output{{Path: "gone", Digest: missing, Size: 3}}},
		{Key: "import-resized", Outputs: []store.Output{{Path: "v", Digest: blobs[2], Size: size + 1}}},
	}
	seen := map[digest.Digest]int64{}
	rep, err := s.VerifyWith(ctx, store.VerifyOptions{Parallel: 4, Also: also,
		Blob: func(d, got digest.Digest, n int64) {
			if got != d {
				t.Errorf("blob %s hashes to %s", d, got)
			}
			seen[d] = n
		}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Blobs != 5 || len(seen) != 5 || rep.Records != 4 || rep.Unreferenced != 2 || len(rep.Problems) != 2 {
		t.Fatalf("verify with the cache's records: %+v, blobs seen %v", rep, seen)
	}
	for _, p := range rep.Problems {
		switch {
		case p.Record == "import-gone" && p.Blob == missing && p.Output == "gone" && errors.Is(p.Err, store.ErrBlobMissing):
		case p.Record == "import-resized" && p.Blob == blobs[2] && p.Output == "v" && errors.Is(p.Err, store.ErrSizeMismatch):
		default:
			t.Errorf("problem %+v", p)
		}
	}

	// Exclusive: blobs just stored go (no grace period), those the
	// cache's records name stay.
	var removed []digest.Digest
	g, err := s.GC(ctx, store.GCOptions{Exclusive: true, Keep: []digest.Digest{blobs[1], blobs[2]},
		Removed: func(d digest.Digest, in store.Info) {
			if in.Size != size {
				t.Errorf("removed %s of %d bytes", d, in.Size)
			}
			removed = append(removed, d)
		}})
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(removed, func(i, j int) bool { return removed[i] < removed[j] })
	want := []digest.Digest{blobs[3], blobs[4]}
	sort.Slice(want, func(i, j int) bool { return want[i] < want[j] })
	if g.RemovedBlobs != 2 || g.RemovedBytes != 2*size || g.KeptBlobs != 3 || g.KeptYoung != 0 || !slices.Equal(removed, want) {
		t.Fatalf("exclusive gc: %+v, removed %v, want %v", g, removed, want)
	}
	for i, d := range blobs {
		if _, ok, err := s.HasBlob(ctx, d); ok != (i < 3) || err != nil {
			t.Errorf("blob %d: stored %v (%v)", i, ok, err)
		}
	}
	// It held the gc lease (a machine sharing the directory as file://
	// waits for it before reusing a blob) and gave it back.
	if li, _, live, err := s.LeaseStatus(ctx, "gc"); err != nil || live || !li.Released || li.Holder != "a" {
		t.Errorf("the gc lease after an exclusive gc: %+v live %v, %v", li, live, err)
	}
}
