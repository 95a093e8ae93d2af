package main

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/stream"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/rs/zerolog"

	"github.com/ferry-llm/ferry/internal/s3test"
	"github.com/ferry-llm/ferry/pipeline"
)

// The fault tests run ferry as separate processes, so the S3 client's
// retry count is out of reach; the proxy counts instead, with toxics of
// the test's own: "cut" passes a connection's first Bytes bytes in its
// direction and closes it at the first byte past them, for the first Times
// connections that go past (toxiproxy's limit_data, with a budget so that
// the retries then pass, counting the connections it cut), and "stall"
// drops every byte until it is removed, then closes the connections it
// held (toxiproxy's timeout with timeout 0, counting the bytes it held).
// A third, "count", passes everything and counts the bytes (into
// upBytes or downBytes, its attribute down says which), so that a test
// can act when a transfer is under way.
var (
	cutConns     atomic.Int64
	stalledBytes atomic.Int64
	upBytes      atomic.Int64
	downBytes    atomic.Int64
)

func init() {
	toxics.Register("cut", new(cutToxic))
	toxics.Register("stall", new(stallToxic))
	toxics.Register("count", new(countToxic))
}

// pipe hands each chunk of a connection's direction to each, until the
// toxic is removed or the stream ends, or each says to close it.
func pipe(stub *toxics.ToxicStub, each func(c *stream.StreamChunk) (close bool)) {
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil || each(c) {
				stub.Close()
				return
			}
		}
	}
}

type countToxic struct {
	Down bool `json:"down"`
}

func (t *countToxic) Pipe(stub *toxics.ToxicStub) {
	n := &upBytes
	if t.Down {
		n = &downBytes
	}
	pipe(stub, func(c *stream.StreamChunk) bool {
		n.Add(int64(len(c.Data)))
		stub.Output <- c
		return false
	})
}

type cutToxic struct {
	Bytes int64 `json:"bytes"`
	// Times is how many connections it cuts, then it passes everything.
	Times int64 `json:"times"`
	cuts  atomic.Int64
}

type cutState struct{ passed int64 }

func (t *cutToxic) NewState() interface{} { return new(cutState) }

func (t *cutToxic) Pipe(stub *toxics.ToxicStub) {
	st := stub.State.(*cutState)
	pipe(stub, func(c *stream.StreamChunk) bool {
		left := t.Bytes - st.passed
		if int64(len(c.Data)) > left && t.cuts.Add(1) <= t.Times {
			if left > 0 {
				stub.Output <- &stream.StreamChunk{Data: c.Data[:left], Timestamp: c.Timestamp}
			}
			st.passed = t.Bytes
			cutConns.Add(1)
			return true
		}
		stub.Output <- c
		st.passed += int64(len(c.Data))
		return false
	})
}

type stallToxic struct{}

func (t *stallToxic) Pipe(stub *toxics.ToxicStub) {
	pipe(stub, func(c *stream.StreamChunk) bool {
		stalledBytes.Add(int64(len(c.Data)))
		return false
	})
}

// Cleanup closes a held connection when the stall is removed: what was
// sent into it is lost, and the client must ask again.
func (t *stallToxic) Cleanup(stub *toxics.ToxicStub) { stub.Close() }

// s3Proxy is an in-process toxiproxy in front of a versitygw.
type s3Proxy struct {
	t *testing.T
	p *toxiproxy.Proxy
}

// newS3Proxy starts a proxy to srv and points the S3 endpoint of the
// ferry processes the test starts at it.
func newS3Proxy(t *testing.T, srv *s3test.Server) *s3Proxy {
	t.Helper()
	ts := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(ts, "s3", "127.0.0.1:0", strings.TrimPrefix(srv.Endpoint, "http://"))
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	t.Setenv("AWS_ENDPOINT_URL_S3", "http://"+p.Listen)
	return &s3Proxy{t: t, p: p}
}

func (x *s3Proxy) add(name, typ, stream, attrs string) {
	x.t.Helper()
	js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"attributes":%s}`, name, typ, stream, attrs)
	if _, err := x.p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
		x.t.Error(err) // not Fatal: it runs in the goroutine acting during a run too
	}
}

func (x *s3Proxy) remove(name string) {
	if err := x.p.Toxics.RemoveToxic(context.Background(), name); err != nil {
		x.t.Error(err)
	}
}

// stallBoth stalls both directions until unstall.
func (x *s3Proxy) stallBoth() {
	x.add("stall-up", "stall", "upstream", `{}`)
	x.add("stall-down", "stall", "downstream", `{}`)
}

func (x *s3Proxy) unstall() {
	x.remove("stall-up")
	x.remove("stall-down")
}

// faultRun runs m's pipeline while during (when not nil) acts on the
// proxy, and returns the events, the exit code and stderr once both end.
func faultRun(t *testing.T, m sharedMachine, during func()) ([]pipeline.Event, int, string) {
	t.Helper()
	cmd, ch, errb := m.startRun(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if during != nil {
			during()
		}
	}()
	evs, code := collect(t, m, cmd, ch, errb)
	<-done
	return evs, code, errb.String()
}

// waitCounted waits (at most 20 s) until n has counted at least want
// bytes more than from.
func waitCounted(n *atomic.Int64, from, want int64) bool {
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if n.Load()-from >= want {
			return true
		}
	}
	return false
}

// stallMidTransfer stalls both directions once 2 MB have gone up (down:
// come down) since it was called, which only a blob's body carries, holds
// them half a second once the stall holds 64 KiB, and lets them go.
func stallMidTransfer(x *s3Proxy, down bool) {
	n := &upBytes
	if down {
		n = &downBytes
	}
	if !waitCounted(n, n.Load(), 2<<20) {
		return
	}
	before := stalledBytes.Load()
	x.stallBoth()
	waitCounted(&stalledBytes, before, 64<<10)
	time.Sleep(500 * time.Millisecond)
	x.unstall()
}

// wantFetched checks that every stage but the imports was skipped by a
// run as made on maker and fetched.
func wantFetched(t *testing.T, who string, evs []pipeline.Event, maker string) {
	t.Helper()
	runs, skips := byStage(evs, pipeline.EventRun), byStage(evs, pipeline.EventSkip)
	for _, st := range []string{"merged", "f16", "quants", "checked"} {
		if len(runs[st]) != 0 || len(skips[st]) != 1 || !strings.HasPrefix(skips[st][0].Reason, "made on "+maker) {
			t.Errorf("%s: stage %s ran %d times, skips %v; want it skipped as made on %s", who, st, len(runs[st]), skips[st], maker)
		}
	}
}

// Faults between ferry and the bucket: the demo pipeline on an s3://
// store reached through a toxiproxy in front of a real versitygw. In each
// case machine-a makes every stage and publishes it through the faulty
// link, then machine-b (a cache of its own) runs the same pipeline and
// fetches every stage through it. Both exit 0 with outputs byte-identical
// to a local-store run's, `ferry store verify` passes, and where the
// fault cuts or holds connections the proxy saw it do so in each run:
//
//   - reset: the first 3 connections that carry more than 1 MB up (the
//     publishes) or down (the fetches) are cut there, in the middle of a
//     blob's body;
//   - stall: everything stops mid-transfer for half a second, then the held
//     connections close;
//   - latency: 20 ms each way.
//
// And a run that cannot finish: the proxy goes down for good while
// machine-a publishes the merge. The run exits non-zero naming the stage
// and the store, the bucket holds nothing that is not whole (verify
// passes), and machine-a's next run, with a link again, shares what it
// made without making it again: machine-b then fetches everything.
func TestPipelineSharedFaults(t *testing.T) {
	// The bandwidth toxic logs through zerolog's global logger.
	defer zerolog.SetGlobalLevel(zerolog.GlobalLevel())
	zerolog.SetGlobalLevel(zerolog.Disabled)
	srv := s3test.Start(t, "ferry-faults")
	srv.Env(t)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	direct := []string{"AWS_ENDPOINT_URL_S3=" + srv.Endpoint}

	loc := newSharedMachine(t, t.TempDir(), "local", ".ferry")
	if r := execFerry(t, nil, "pipeline", "run", "-j", "2", loc.file); r.code != 0 {
		t.Fatalf("local run: exit %d\n%s", r.code, r.stderr)
	}
	want := viewFiles(t, loc.dir)

	verify := func(t *testing.T, url string) {
		t.Helper()
		start := time.Now()
		r := execFerry(t, direct, "store", "verify", url)
		if r.code != 0 {
			t.Errorf("store verify %s: exit %d\n%s%s", url, r.code, r.stdout, r.stderr)
		}
		t.Logf("store verify %s: %v", url, time.Since(start).Round(time.Millisecond))
	}

	for _, tc := range []struct {
		name string
		// setup adds the toxics before each machine runs.
		setup func(x *s3Proxy)
		// during acts on the proxy while a machine runs (fetch:
		// machine-b's run).
		during func(x *s3Proxy, fetch bool)
		// check says whether the fault happened, given what the proxy
		// counted during one machine's run.
		check func(t *testing.T, who string, cuts, stalled int64)
	}{
		{
			name: "reset",
			setup: func(x *s3Proxy) {
				x.add("cut-up", "cut", "upstream", `{"bytes":1000000,"times":3}`)
				x.add("cut-down", "cut", "downstream", `{"bytes":1000000,"times":3}`)
			},
			check: func(t *testing.T, who string, cuts, _ int64) {
				if cuts == 0 {
					t.Errorf("%s: no connection was cut", who)
				}
			},
		},
		{
			name: "stall",
			setup: func(x *s3Proxy) {
				// Slow enough that the stall lands inside a body.
				x.add("bw-up", "bandwidth", "upstream", `{"rate":20000}`)
				x.add("bw-down", "bandwidth", "downstream", `{"rate":20000}`)
			},
			// machine-a stalls while it publishes, machine-b while it
			// fetches.
			during: stallMidTransfer,
			check: func(t *testing.T, who string, _, stalled int64) {
				if stalled < 64<<10 {
					t.Errorf("%s: the stall held %d bytes, want a body's worth (64 KiB or more)", who, stalled)
				}
			},
		},
		{
			name: "latency",
			setup: func(x *s3Proxy) {
				x.add("lat-up", "latency", "upstream", `{"latency":20}`)
				x.add("lat-down", "latency", "downstream", `{"latency":20}`)
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := "s3://ferry-faults/" + tc.name
			root := t.TempDir()
			for _, run := range []struct {
				m     sharedMachine
				fetch bool
			}{
				{newSharedMachine(t, root, "machine-a", url), false},
				{newSharedMachine(t, root, "machine-b", url), true},
			} {
				// A proxy of its own for each machine's run: the
				// faults start again.
				x := newS3Proxy(t, srv)
				x.add("count-up", "count", "upstream", `{}`)
				x.add("count-down", "count", "downstream", `{"down":true}`)
				tc.setup(x)
				cuts0, stalled0 := cutConns.Load(), stalledBytes.Load()
				var during func()
				if tc.during != nil {
					during = func() { tc.during(x, run.fetch) }
				}
				start := time.Now()
				evs, code, stderr := faultRun(t, run.m, during)
				cuts, stalled := cutConns.Load()-cuts0, stalledBytes.Load()-stalled0
				t.Logf("%s: exit %d in %v; the proxy cut %d connections, stalled %d bytes", run.m.name, code, time.Since(start).Round(time.Millisecond), cuts, stalled)
				if code != 0 {
					t.Fatalf("%s: exit %d\n%s", run.m.name, code, stderr)
				}
				if run.fetch {
					wantFetched(t, run.m.name, evs, "machine-a")
				}
				sameFiles(t, run.m.name, viewFiles(t, run.m.dir), want)
				if tc.check != nil {
					tc.check(t, run.m.name, cuts, stalled)
				}
			}
			verify(t, url)
		})
	}

	t.Run("down during publish", func(t *testing.T) {
		const url = "s3://ferry-faults/down"
		root := t.TempDir()
		a := newSharedMachine(t, root, "machine-a", url)
		b := newSharedMachine(t, root, "machine-b", url)
		x := newS3Proxy(t, srv)
		x.add("count-up", "count", "upstream", `{}`)
		x.add("bw-up", "bandwidth", "upstream", `{"rate":20000}`)
		// Once 1 MB has gone up (the merge's blobs are the first bodies
		// the run sends), hold the link until the stall holds 64 KiB of
		// the upload, then take the proxy down for good.
		var held bool
		_, code, stderr := faultRun(t, a, func() {
			if !waitCounted(&upBytes, upBytes.Load(), 1<<20) {
				return
			}
			before := stalledBytes.Load()
			x.add("stall-up", "stall", "upstream", `{}`)
			held = waitCounted(&stalledBytes, before, 64<<10)
			x.p.Stop()
		})
		if !held {
			t.Fatalf("machine-a: the proxy went down before the merge's upload was under way (exit %d)\n%s", code, stderr)
		}
		if code == 0 {
			t.Fatalf("machine-a: exit 0 with the store unreachable during the publish\n%s", stderr)
		}
		if !strings.Contains(stderr, "stage merged") || !strings.Contains(stderr, url) {
			t.Errorf("machine-a: exit %d; stderr names not the stage merged and %s:\n%s", code, url, stderr)
		}
		verify(t, url)
		ref := func() error {
			_, err := srv.Client().HeadObject(context.Background(), &s3.HeadObjectInput{
				Bucket: aws.String("ferry-faults"), Key: aws.String("down/refs/pipelines/demo/merged")})
			return err
		}
		if ref() == nil {
			t.Errorf("the merge's ref is in the bucket although its publish was cut off")
		}

		// The link is back: machine-a's next run shares what it made and
		// makes only what it could not start.
		newS3Proxy(t, srv)
		evs, code, stderr := faultRun(t, a, nil)
		if code != 0 {
			t.Fatalf("machine-a again: exit %d\n%s", code, stderr)
		}
		if es := byStage(evs, pipeline.EventRun)["merged"]; len(es) != 0 {
			t.Errorf("machine-a again: the merge ran again: %v", es)
		}
		if err := ref(); err != nil {
			t.Errorf("machine-a again: the merge's ref: %v", err)
		}
		verify(t, url)
		evs, code, stderr = faultRun(t, b, nil)
		if code != 0 {
			t.Fatalf("machine-b: exit %d\n%s", code, stderr)
		}
		wantFetched(t, "machine-b", evs, "machine-a")
		sameFiles(t, "machine-a", viewFiles(t, a.dir), want)
		sameFiles(t, "machine-b", viewFiles(t, b.dir), want)
	})
}
