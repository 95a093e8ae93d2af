package store_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	mrand "math/rand/v2"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/cpushare"
	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/store"
	"github.com/ferry-llm/ferry/store/local"
)

// coreProbe is a backend whose server is on this machine or not, and
// which looks, during each request that stores a part or a small blob,
// whether it can take the one core of cores (from the stage holding it,
// which offers it: not from the part, which holds it through the
// request); it refuses the part numbered fail.
type coreProbe struct {
	store.Backend
	here       bool
	cores      *cpushare.Gate
	held, free atomic.Int32
	fail       int
}

func (b *coreProbe) OnThisMachine() bool { return b.here }

func (b *coreProbe) look() {
	// As urgent as a part: a stage holding the core offers it at once.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if b.cores.Acquire(ctx, math.MaxInt64) == nil {
		b.cores.Release()
		b.free.Add(1)
	} else {
		b.held.Add(1)
	}
}

func (b *coreProbe) UploadPart(ctx context.Context, key, id string, n int, body []byte, sum [32]byte) (store.Part, error) {
	b.look()
	if n == b.fail {
		return store.Part{}, errors.New("injected: part refused")
	}
	return b.Backend.UploadPart(ctx, key, id, n, body, sum)
}

func (b *coreProbe) Put(ctx context.Context, key string, body []byte, opt store.PutOptions) (store.Info, error) {
	if len(key) > 6 && key[:6] == "blobs/" {
		b.look()
	}
	return b.Backend.Put(ctx, key, body, opt)
}

// A part takes a core of Options.Cores before the work beside it (a
// stage holding the gate's one core, offering it between units, gets it
// back only between parts): while ferry hashes it, and, with the server
// on this machine, until the server has it; elsewhere the core is free
// while the request is out. The core is given back after every part, a
// refused one too.
func TestPartsTakeCoresFirst(t *testing.T) {
	r := mrand.NewChaCha8([32]byte{9})
	for _, c := range []struct {
		name string
		here bool
		size int
		fail int
	}{
		{"server here, multipart", true, 3*store.MinPartSize - 100, 0},
		{"server here, one write", true, store.MinPartSize / 2, 0},
		{"server elsewhere, multipart", false, 3*store.MinPartSize - 100, 0},
		{"server elsewhere, one write", false, store.MinPartSize / 2, 0},
		{"server here, a part refused", true, 3*store.MinPartSize - 100, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			lb, err := local.New(filepath.Join(t.TempDir(), "store"))
			if err != nil {
				t.Fatal(err)
			}
			cores := cpushare.New(1)
			b := &coreProbe{Backend: lb, here: c.here, cores: cores, fail: c.fail}
			ctx := context.Background()
			s, err := store.Open(ctx, b, store.Options{CacheDir: t.TempDir(), PartSize: store.MinPartSize, UploadParallel: 1, SkipProbe: true, Cores: cores})
			if err != nil {
				t.Fatal(err)
			}
			// A stage: holds the core, offers it every millisecond.
			sctx, stop := context.WithCancel(ctx)
			stageDone := make(chan struct{})
			if err := cores.Acquire(ctx, 1); err != nil {
				t.Fatal(err)
			}
			go func() {
				defer close(stageDone)
				for sctx.Err() == nil {
					if cores.Yield(sctx, 1) != nil {
						return // holds none
					}
					time.Sleep(time.Millisecond)
				}
				cores.Release()
			}()
			data := make([]byte, c.size)
			r.Read(data)
			// A part that waited behind the stage would wait for good.
			pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
			err = s.PutBlob(pctx, digest.Of(data), bytes.NewReader(data), int64(len(data)), nil)
			pcancel()
			stop()
			<-stageDone
			if (err != nil) != (c.fail > 0) || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("PutBlob: %v", err)
			}
			held, free := b.held.Load(), b.free.Load()
			if c.here && free != 0 || !c.here && held != 0 || held+free == 0 {
				t.Errorf("requests with the core held by the part: %d, with it free: %d; want all %v", held, free, map[bool]string{true: "held", false: "free"}[c.here])
			}
			// Every core given back.
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if err := cores.Acquire(actx, 0); err != nil {
				t.Fatalf("the core is not given back after the upload: %v", err)
			}
		})
	}
}
