package transfer

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
	"golang.org/x/crypto/ssh"

	"github.com/ferry-llm/ferry/internal/progress"
	"github.com/ferry-llm/ferry/internal/sshdtest"
)

// toxic is an in-process toxiproxy in front of the test sshd.
type toxic struct {
	t     testing.TB
	proxy *toxiproxy.Proxy
}

func newToxic(t testing.TB, upstream string) *toxic {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "sshd", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return &toxic{t: t, proxy: p}
}

func (x *toxic) addr() string { return x.proxy.Listen }

// add adds a toxic: typ, stream ("upstream": towards sshd), attributes.
func (x *toxic) add(name, typ, stream string, attrs string) {
	x.t.Helper()
	js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"attributes":%s}`, name, typ, stream, attrs)
	if _, err := x.proxy.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
		x.t.Fatal(err)
	}
}

func (x *toxic) remove(name string) {
	if err := x.proxy.Toxics.RemoveToxic(context.Background(), name); err != nil {
		x.t.Error(err)
	}
}

// Through a proxy that misbehaves, the copy retries, resumes and ends
// byte-identical, and the data crosses the link about once.
func TestFaults(t *testing.T) {
	s := startSSHD(t)
	cases := []struct {
		name  string
		setup func(x *toxic)
		// during runs while the copy runs
		during func(x *toxic)
		redial bool // connections must have been lost and made again
	}{
		{name: "reset mid-chunk", setup: func(x *toxic) {
			// Every connection is cut after 600 kB towards the server,
			// inside the third 256 KiB chunk it carries.
			x.add("cut", "limit_data", "upstream", `{"bytes":600000}`)
		}, redial: true},
		{name: "latency and bandwidth", setup: func(x *toxic) {
			x.add("lat", "latency", "upstream", `{"latency":10}`)
			x.add("lat2", "latency", "downstream", `{"latency":10}`)
			x.add("bw", "bandwidth", "upstream", `{"rate":8000}`)
		}},
		{name: "stall", setup: func(x *toxic) {
			x.add("bw", "bandwidth", "upstream", `{"rate":2000}`)
		}, during: func(x *toxic) {
			time.Sleep(200 * time.Millisecond)
			x.add("stall", "timeout", "upstream", `{"timeout":0}`)
			time.Sleep(time.Second)
			x.remove("stall")
		}, redial: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			x := newToxic(t, s.Addr())
			src := filepath.Join(t.TempDir(), "w.bin")
			want := randomFile(t, src, 2<<20+77, 11)
			tc.setup(x)
			dst := t.TempDir()
			p, err := NewPlan(context.Background(), []string{src}, PlanOptions{ChunkSize: 256 << 10})
			if err != nil {
				t.Fatal(err)
			}
			var dials atomic.Int32
			dial := testDialer(s, x.addr())
			d := Destination{Name: "proxied:" + dst, Host: "proxied", Dir: dst, Dial: func(ctx context.Context) (*ssh.Client, error) {
				dials.Add(1)
				return dial(ctx)
			}}
			if tc.during != nil {
				go tc.during(x)
			}
			rep, err := Run(context.Background(), p, []Destination{d}, Options{
				StateDir: t.TempDir(), Log: testLog(t), Streams: 3,
				Backoff: 20 * time.Millisecond, StallTimeout: 500 * time.Millisecond, DialTimeout: 2 * time.Second, Retries: 20,
			})
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join(dst, "w.bin"))
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("remote file differs (%v)", err)
			}
			if tc.redial && dials.Load() <= 3 {
				t.Errorf("%d connections for 3 streams: the fault did not cut any", dials.Load())
			}
			h := rep.Hosts[0]
			if !h.OK || !h.Files[0].Verified {
				t.Errorf("report: %+v", h)
			}
			// Chunks are written once (Sent counts those acknowledged).
			if h.Sent != int64(len(want)) {
				t.Errorf("sent %d bytes for a %d-byte file", h.Sent, len(want))
			}
		})
	}
}

// A chunk altered on the remote side after it was written and journaled
// is found by the final check and sent again, alone.
type progressReporter = progress.Reporter

// cancelAt cancels once n reaches at.
type cancelAt struct {
	n      *atomic.Int64
	at     int64
	cancel func()
}

func (c *cancelAt) SetTotal(int64) {}
func (c *cancelAt) Close() error   { return nil }
func (c *cancelAt) Add(k int64) {
	if c.n.Add(k) >= c.at {
		c.cancel()
	}
}

var _ = sshdtest.Start
