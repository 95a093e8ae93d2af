package pipeline

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// A stage's upload bar counts each byte once: an upload after an early
// one that failed (which resumes from, or starts over before, the bytes
// that one counted) skips what that one counted; nothing is counted
// after the bar is closed, and it is closed once.
func TestShareBarCountsOnce(t *testing.T) {
	for _, c := range []struct {
		name string
		skip int64
		adds []int64
		want int64
	}{
		{"no early upload", 0, []int64{16, 16, 4}, 36},
		{"resumed after two parts", 32, []int64{32, 16, 4}, 52 - 32},
		{"started over after one part", 16, []int64{16, 16, 16, 4}, 52 - 16},
		{"skip within an add", 10, []int64{16, 16}, 22},
		{"nothing to count", 20, []int64{8, 8}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			bars := &ShareBars{}
			b := &shareBar{r: &runner{opts: Options{ShareProgress: bars.New}}, stage: "s"}
			b.setTotal(100)
			add := b.adder(c.skip)
			for _, n := range c.adds {
				add(n)
			}
			b.close()
			b.close()
			add(8)
			b.grow(8)
			seen := bars.Of["s"]
			if seen.Done != c.want || seen.Opened != 1 || seen.Closed != 1 || seen.Total != 100 {
				t.Errorf("counted %d of %d, opened %d, closed %d; want %d of 100, once, once", seen.Done, seen.Total, seen.Opened, seen.Closed, c.want)
			}
		})
	}
}

// ShareBars records the upload bars of a run (Options.ShareProgress) by
// stage, and what each counted before its stage's done event.
type ShareBars struct {
	Mu   sync.Mutex
	Of   map[string]*ShareBarSeen
	done map[string]bool
}

// ShareBarSeen is what one stage's upload bars were told.
type ShareBarSeen struct {
	Opened, Closed          int
	Total, Done, BeforeDone int64
}

type shareBarRec struct {
	s     *ShareBars
	stage string
}

// New is an Options.ShareProgress.
func (s *ShareBars) New(stage string) Progress {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	if s.Of == nil {
		s.Of = map[string]*ShareBarSeen{}
	}
	if s.Of[stage] == nil {
		s.Of[stage] = &ShareBarSeen{}
	}
	s.Of[stage].Opened++
	return &shareBarRec{s, stage}
}

// Event is an Options.Events.
func (s *ShareBars) Event(e Event) {
	if e.Event == EventDone {
		s.Mu.Lock()
		if s.done == nil {
			s.done = map[string]bool{}
		}
		s.done[e.Stage] = true
		s.Mu.Unlock()
	}
}

func (b *shareBarRec) SetTotal(n int64) {
	b.s.Mu.Lock()
	b.s.Of[b.stage].Total = n
	b.s.Mu.Unlock()
}

func (b *shareBarRec) Add(n int64) {
	b.s.Mu.Lock()
	seen := b.s.Of[b.stage]
	seen.Done += n
	if !b.s.done[b.stage] {
		seen.BeforeDone += n
	}
	b.s.Mu.Unlock()
}

func (b *shareBarRec) Close() error {
	b.s.Mu.Lock()
	b.s.Of[b.stage].Closed++
	b.s.Mu.Unlock()
	return nil
}

// A shared merge's plan counts the memory of its pass ahead: its workers'
// row blocks (half the merge's) and its own factors, beside the merge's.
func TestMergePlanCountsPassAhead(t *testing.T) {
	models, err := filepath.Abs("../testdata/models/qwen35-tiny")
	if err != nil {
		t.Fatal(err)
	}
	spec, err := Parse("m.yaml", "/p", []byte("name: m\nstages:\n  - name: base\n    import: { path: b }\n  - name: adapter\n    import: { path: a }\n  - name: merged\n    merge: { base: base, adapter: adapter }\n"))
	if err != nil {
		t.Fatal(err)
	}
	ins := []Input{{Stage: "base", Dir: filepath.Join(models, "base")}, {Stage: "adapter", Dir: filepath.Join(models, "adapter-dora")}}
	mem := map[bool]int64{}
	for _, shared := range []bool{false, true} {
		p, err := spec.Lookup("merged").Stage.(Planner).Plan(t.Context(), &Env{Stage: "merged", Jobs: 8, Inputs: ins, shared: shared})
		if err != nil {
			t.Fatal(err)
		}
		mem[shared] = p.Memory
	}
	// The merge: 9 blocks and its factors twice; the pass ahead: 5
	// blocks (4 workers and the writer's) and its factors twice.
	local := mem[false] - 64<<20
	extra := mem[true] - mem[false]
	if extra <= 0 || extra >= local || extra*9 < local*4 {
		t.Errorf("shared merge plans %d bytes, local %d: the pass ahead adds %d, want about 5/9 of the local %d", mem[true], mem[false], extra, local)
	}
}

// A growing file's ReadAt waits until the bytes it asks for are flushed,
// then reads them; a Close (the shard started over) wakes a waiting one
// with an error; bytes said to be flushed but not in the file (cut
// short) are an error, not a short read; a stopped context ends a wait.
func TestGrowingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shard.partial")
	data := []byte("0123456789abcdef")
	if err := os.WriteFile(path, data[:8], 0o644); err != nil {
		t.Fatal(err)
	}
	open := func(ctx context.Context, flushed *atomic.Int64) *growingFile {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		g := &growingFile{ctx: ctx, f: f, flushed: flushed.Load, size: int64(len(data))}
		t.Cleanup(func() { g.Close() })
		return g
	}
	read := func(g *growingFile, off, n int) chan error {
		errc := make(chan error, 1)
		go func() {
			buf := make([]byte, n)
			_, err := g.ReadAt(buf, int64(off))
			if err == nil && string(buf) != string(data[off:off+n]) {
				err = errors.New("read " + string(buf))
			}
			errc <- err
		}()
		return errc
	}
	waits := func(errc chan error) {
		t.Helper()
		select {
		case err := <-errc:
			t.Fatalf("ReadAt returned before its bytes were flushed: %v", err)
		case <-time.After(30 * time.Millisecond):
		}
	}

	// Waits, then reads once flushed.
	var flushed atomic.Int64
	flushed.Store(8)
	g := open(context.Background(), &flushed)
	if err := <-read(g, 0, 8); err != nil {
		t.Fatal(err)
	}
	errc := read(g, 4, 12)
	waits(errc)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	flushed.Store(16)
	if err := <-errc; err != nil {
		t.Fatalf("after the flush: %v", err)
	}

	// A close wakes a waiting read.
	var none atomic.Int64
	g = open(context.Background(), &none)
	errc = read(g, 0, 4)
	waits(errc)
	g.Close()
	if err := <-errc; !errors.Is(err, os.ErrClosed) {
		t.Errorf("closed while waiting: %v, want os.ErrClosed", err)
	}

	// Said flushed, not in the file: cut short.
	var all atomic.Int64
	all.Store(16)
	g = open(context.Background(), &all)
	if err := os.Truncate(path, 10); err != nil {
		t.Fatal(err)
	}
	if err := <-read(g, 8, 8); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut short: %v, want io.ErrUnexpectedEOF", err)
	}

	// A stopped context ends a wait.
	ctx, cancel := context.WithCancel(context.Background())
	g = open(ctx, &none)
	errc = read(g, 0, 4)
	waits(errc)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("stopped while waiting: %v, want context.Canceled", err)
	}
}
