package s3_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/s3test"
	"github.com/ferry-llm/ferry/store"
	s3store "github.com/ferry-llm/ferry/store/s3"
)

// killParts is how many parts the killed upload must have made durable.
const killParts = 2

// A process uploading a blob to S3 is killed with SIGKILL once its
// journal holds two parts; the next upload of the blob, in another
// process, stores only the parts the first did not, and the blob is whole.
func TestUploadKilled(t *testing.T) {
	if os.Getenv("FERRY_KILL_CHILD") != "" {
		uploadChild(t)
		return
	}
	srv := s3test.Start(t, "ferry-kill")
	srv.Env(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "blob")
	data := writeRandom(t, src, 3, 8*store.MinPartSize+999)
	d := digest.Of(data)
	cache := filepath.Join(dir, "cache")
	// The journal, in the cache's directory of this store.
	jp := func() string {
		m, _ := filepath.Glob(filepath.Join(cache, "uploads", "*", d.Hex()))
		if len(m) != 1 {
			return filepath.Join(cache, "none")
		}
		return m[0]
	}
	killChildWhen(t, "TestUploadKilled", []string{"FERRY_KILL_CHILD=" + src, "FERRY_KILL_CACHE=" + cache, "FERRY_KILL_DIGEST=" + string(d)},
		fmt.Sprintf("%d journaled parts", killParts), func() bool { return partsIn(jp()) >= killParts })
	journaled := partsIn(jp())
	nparts := int64(len(data)+store.MinPartSize-1) / store.MinPartSize
	if int64(journaled) >= nparts-1 {
		t.Fatalf("the child was killed too late (%d parts journaled)", journaled)
	}

	ctx := context.Background()
	b, err := s3store.Open(ctx, "s3://ferry-kill/p")
	if err != nil {
		t.Fatal(err)
	}
	cb := &partCounter{Backend: b}
	s, err := store.Open(ctx, cb, store.Options{CacheDir: cache, PartSize: store.MinPartSize, Parallel: 1, SkipProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.HasBlob(ctx, d); ok {
		t.Fatal("the killed upload completed")
	}
	if err := s.PutFile(ctx, d, src, nil); err != nil {
		t.Fatal(err)
	}
	if got := cb.n.Load(); got > nparts-int64(journaled) {
		t.Errorf("the resumed upload stored %d parts; %d of %d were journaled durable before the kill", got, journaled, nparts)
	}
	t.Logf("killed with %d of %d parts journaled; the resume stored %d", journaled, nparts, cb.n.Load())
	if v, err := s.Verify(ctx, nil); err != nil || !v.OK() || v.Blobs != 1 {
		t.Fatalf("verify: %+v, %v", v, err)
	}
}

func uploadChild(t *testing.T) {
	ctx := context.Background()
	b, err := s3store.Open(ctx, "s3://ferry-kill/p")
	if err != nil {
		t.Fatal(err)
	}
	s, err := store.Open(ctx, b, store.Options{CacheDir: os.Getenv("FERRY_KILL_CACHE"), PartSize: store.MinPartSize, Parallel: 1})
	if err != nil {
		t.Fatal(err)
	}
	d := digest.Digest(os.Getenv("FERRY_KILL_DIGEST"))
	// Slowed down after each part so that the kill lands mid-upload.
	err = s.PutFile(ctx, d, os.Getenv("FERRY_KILL_CHILD"), func(int64) { time.Sleep(200 * time.Millisecond) })
	t.Fatalf("the child finished (%v) before it was killed", err)
}

// killChildWhen runs test in a child process with env added, and kills it
// with SIGKILL once ready says so (within 30 s).
func killChildWhen(t *testing.T, test string, env []string, what string, ready func() bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$")
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	deadline := time.Now().Add(30 * time.Second)
	for !ready() {
		if time.Now().After(deadline) {
			t.Fatalf("the child had no %s in 30 s:\n%s", what, out.String())
		}
		time.Sleep(time.Millisecond)
	}
}

// writeRandom writes n pseudo-random bytes of seed to path and returns them.
func writeRandom(t *testing.T, path string, seed uint64, n int) []byte {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, seed+1))
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return data
}

// partsIn counts the part lines of an upload journal.
func partsIn(path string) int {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"unit":"part `) {
			n++
		}
	}
	return n
}

type partCounter struct {
	store.Backend
	n atomic.Int64
}

func (c *partCounter) UploadPart(ctx context.Context, key, id string, n int, body []byte, sum [32]byte) (store.Part, error) {
	p, err := c.Backend.UploadPart(ctx, key, id, n, body, sum)
	if err == nil {
		c.n.Add(1)
	}
	return p, err
}

// A process fetching a blob from S3 is killed with SIGKILL once its
// journal holds two checkpoints; the next fetch, in another process,
// reads only the bytes after the last checkpoint, and the file is the blob.
func TestFetchKilled(t *testing.T) {
	if os.Getenv("FERRY_KILL_CHILD") != "" {
		fetchChild(t)
		return
	}
	srv := s3test.Start(t, "ferry-kill")
	srv.Env(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "blob")
	data := writeRandom(t, src, 5, 12*store.MinPartSize+777)
	d := digest.Of(data)
	ctx := context.Background()
	b, err := s3store.Open(ctx, "s3://ferry-kill/p")
	if err != nil {
		t.Fatal(err)
	}
	opt := store.Options{CacheDir: filepath.Join(dir, "cache"), PartSize: store.MinPartSize, Parallel: 1}
	s, err := store.Open(ctx, b, opt)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutFile(ctx, d, src, nil); err != nil {
		t.Fatal(err)
	}

	dst := filepath.Join(dir, "out")
	jp := dst + ".partial.journal"
	killChildWhen(t, "TestFetchKilled", []string{"FERRY_KILL_CHILD=" + dst, "FERRY_KILL_CACHE=" + opt.CacheDir, "FERRY_KILL_DIGEST=" + string(d)},
		"2 journaled checkpoints", func() bool { n, _ := chunksIn(jp); return n >= 2 })
	_, end := chunksIn(jp)
	if end <= 0 || end >= int64(len(data)) {
		t.Fatalf("the killed fetch journaled its end at %d of %d bytes", end, len(data))
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Fatalf("the killed fetch left %s: %v", dst, err)
	}

	cb := &rangeCounter{Backend: b}
	s2, err := store.Open(ctx, cb, store.Options{CacheDir: opt.CacheDir, PartSize: store.MinPartSize, Parallel: 2, SkipProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.FetchBlob(ctx, d, dst, nil); err != nil {
		t.Fatal(err)
	}
	if got, want := cb.n.Load(), int64(len(data))-end; got != want {
		t.Errorf("the resumed fetch read %d bytes; %d were left after the checkpoint at %d", got, want, end)
	}
	got, err := os.ReadFile(dst)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the fetched file is not the blob (%d bytes, %v)", len(got), err)
	}
	if _, err := os.Stat(jp); !os.IsNotExist(err) {
		t.Errorf("the journal %s stayed after the fetch: %v", jp, err)
	}
	t.Logf("killed with %d of %d bytes journaled; the resume read %d", end, len(data), cb.n.Load())
}

func fetchChild(t *testing.T) {
	ctx := context.Background()
	b, err := s3store.Open(ctx, "s3://ferry-kill/p")
	if err != nil {
		t.Fatal(err)
	}
	s, err := store.Open(ctx, b, store.Options{CacheDir: os.Getenv("FERRY_KILL_CACHE"), PartSize: store.MinPartSize, Parallel: 1,
		CheckpointEvery: 300 * time.Millisecond, SkipProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	d := digest.Digest(os.Getenv("FERRY_KILL_DIGEST"))
	// Slowed down after each chunk so that the kill lands mid-fetch.
	err = s.FetchBlob(ctx, d, os.Getenv("FERRY_KILL_CHILD"), func(int64) { time.Sleep(150 * time.Millisecond) })
	t.Fatalf("the child finished (%v) before it was killed", err)
}

// chunksIn counts the checkpoints of a download journal and returns the
// end of the last.
func chunksIn(path string) (int, int64) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	n, end := 0, int64(0)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e struct {
			Unit string `json:"unit"`
			End  int64  `json:"end"`
		}
		if json.Unmarshal(sc.Bytes(), &e) == nil && e.Unit == "chunk" {
			n, end = n+1, e.End
		}
	}
	return n, end
}

type rangeCounter struct {
	store.Backend
	n atomic.Int64
}

func (c *rangeCounter) GetRange(ctx context.Context, key string, off int64, buf []byte) error {
	err := c.Backend.GetRange(ctx, key, off, buf)
	if err == nil {
		c.n.Add(int64(len(buf)))
	}
	return err
}
