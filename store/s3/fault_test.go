package s3_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/s3test"
	"github.com/ferry-llm/ferry/store"
	s3store "github.com/ferry-llm/ferry/store/s3"
)

// Through a proxy that cuts connections, delays or stalls them, a
// multipart upload and a ranged download retry, resume and end with the
// same bytes.
func TestFaults(t *testing.T) {
	// The bandwidth toxic logs through zerolog's global logger.
	defer zerolog.SetGlobalLevel(zerolog.GlobalLevel())
	zerolog.SetGlobalLevel(zerolog.Disabled)
	srv := s3test.Start(t, "ferry-faults")
	srv.Env(t)
	r := rand.New(rand.NewPCG(9, 9))
	data := make([]byte, 3*store.MinPartSize+4321)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	d := digest.Of(data)
	for _, tc := range []struct {
		name   string
		faults bool // requests must have been retried
		setup  func(add func(name, typ, stream, attrs string))
		during func(add func(name, typ, stream, attrs string), remove func(string))
	}{
		{name: "reset mid-part", faults: true, setup: func(add func(string, string, string, string)) {
			// Every connection is cut after 8 MB either way: inside the
			// second 5 MiB part or range it carries.
			add("up", "limit_data", "upstream", `{"bytes":8000000}`)
			add("down", "limit_data", "downstream", `{"bytes":8000000}`)
		}},
		{name: "latency", setup: func(add func(string, string, string, string)) {
			add("up", "latency", "upstream", `{"latency":20}`)
			add("down", "latency", "downstream", `{"latency":20}`)
		}},
		{name: "stall", faults: true, setup: func(add func(string, string, string, string)) {
			add("bw", "bandwidth", "upstream", `{"rate":20000}`)
		}, during: func(add func(string, string, string, string), remove func(string)) {
			time.Sleep(300 * time.Millisecond)
			add("stall", "timeout", "upstream", `{"timeout":0}`)
			add("stall2", "timeout", "downstream", `{"timeout":0}`)
			time.Sleep(1500 * time.Millisecond)
			remove("stall")
			remove("stall2")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
			p := toxiproxy.NewProxy(ts, "s3", "127.0.0.1:0", strings.TrimPrefix(srv.Endpoint, "http://"))
			if err := p.Start(); err != nil {
				t.Fatal(err)
			}
			defer p.Stop()
			t.Setenv("AWS_ENDPOINT_URL_S3", "http://"+p.Listen)
			add := func(name, typ, stream, attrs string) {
				js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"attributes":%s}`, name, typ, stream, attrs)
				if _, err := p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
					t.Fatal(err)
				}
			}
			remove := func(name string) {
				if err := p.Toxics.RemoveToxic(context.Background(), name); err != nil {
					t.Error(err)
				}
			}
			ctx := context.Background()
			b, err := s3store.OpenWith(ctx, "s3://ferry-faults/"+strings.ReplaceAll(tc.name, " ", "-"), s3store.Options{StallTimeout: 500 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			s, err := store.Open(ctx, b, store.Options{CacheDir: t.TempDir(), PartSize: store.MinPartSize, Parallel: 2})
			if err != nil {
				t.Fatal(err)
			}
			tc.setup(add)
			if tc.during != nil {
				go tc.during(add, remove)
			}
			if err := s.PutBlob(ctx, d, bytes.NewReader(data), int64(len(data)), nil); err != nil {
				t.Fatal(err)
			}
			dst := filepath.Join(t.TempDir(), "out")
			if err := s.FetchBlob(ctx, d, dst, nil); err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(dst); !bytes.Equal(got, data) {
				t.Fatal("fetched bytes differ")
			}
			t.Logf("%d retries", b.Retries())
			if tc.faults && b.Retries() == 0 {
				t.Error("nothing was retried: the fault did not cut anything")
			}
		})
	}
}

// An endpoint that answered when the store was opened and is gone later
// (the server stopped mid-run) is an outage that may pass (Retryable,
// exit 1), not a wrong setting (exit 2).
func TestEndpointGone(t *testing.T) {
	srv := s3test.Start(t, "ferry-gone")
	srv.Env(t)
	ts := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(ts, "s3", "127.0.0.1:0", strings.TrimPrefix(srv.Endpoint, "http://"))
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_ENDPOINT_URL_S3", "http://"+p.Listen)
	ctx := context.Background()
	b, err := s3store.Open(ctx, "s3://ferry-gone/p")
	if err != nil {
		t.Fatal(err)
	}
	p.Stop()
	_, err = b.Put(ctx, "x", []byte("x"), store.PutOptions{})
	if errkind.Of(err) != errkind.Retryable || !strings.Contains(err.Error(), "lost the S3 endpoint http://"+p.Listen) {
		t.Fatalf("put after the endpoint went: %v (kind %v)", err, errkind.Of(err))
	}
}
