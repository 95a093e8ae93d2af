package transfer

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ferry-llm/ferry/internal/s3test"
)

// flowLimit is the rate, in KB/s, that one connection gets through the
// benchmark's proxy at rttMs: a TCP flow moves at most its window per
// round trip, and the proxy, which reads as fast as it can and delays
// what it read, does not hold that back by itself. The window is
// FERRY_S3_WINDOW bytes, by default 4 MiB, Linux's largest send buffer
// by default (net.ipv4.tcp_wmem): 104.9 MB/s at 40 ms. 0 (no bound) with
// FERRY_S3_WINDOW=0.
func flowLimit(b *testing.B, rttMs int64) int64 {
	w := envInt(b, "FERRY_S3_WINDOW", 4<<20)
	if w <= 0 || rttMs <= 0 {
		return 0
	}
	return w * 1000 / rttMs / 1000
}

// proxiedS3 puts, with FERRY_S3_RTT_MS set, a toxiproxy (a process of its
// own) between the clients and srv, adding half the round trip each way,
// each connection bounded as a TCP flow on such a path is (flowLimit):
// the environment's S3 endpoint becomes the proxy, and the client c
// returned goes through it too. Without it, c as it is.
func proxiedS3(b *testing.B, srv *s3test.Server, c *s3api.Client) *s3api.Client {
	rtt := envInt(b, "FERRY_S3_RTT_MS", 0)
	if rtt <= 0 {
		return c
	}
	if kbps := flowLimit(b, rtt); kbps > 0 {
		b.Setenv("FERRY_TOXI_FLOW_KBPS", strconv.FormatInt(kbps, 10))
	}
	addr, _ := startProxy(b, strings.TrimPrefix(srv.Endpoint, "http://"), int(rtt/2))
	b.Setenv("AWS_ENDPOINT_URL_S3", "http://"+addr)
	o := c.Options()
	o.BaseEndpoint = aws.String("http://" + addr)
	return s3api.New(o)
}

// BenchmarkTransferS3 copies to versitygw on 127.0.0.1 (a real S3
// gateway over a directory of the benchmark's TMPDIR): one file of
// FERRY_S3_SIZE bytes (default 2 GB) and a tree of FERRY_TREE_FILES small
// files (default 5000, 1 B to 64 KiB), each with ferry (hashing the source
// with an empty digest cache; parts or puts with their SHA-256, verified,
// completed) and with the plain single-stream upload of the same bytes:
// one PutObject of the file, one PutObject after another for the tree
// (the SDK's defaults: the payload hashed for the signature, no checksum
// header), into a fresh prefix each run. It reports seconds per run, MB/s
// and x-put, the single stream's time / ferry's (above 1: ferry is
// faster). FERRY_S3_RTT_MS (default 0) puts a toxiproxy adding that
// round trip between both clients and the server, each connection bounded
// to what a TCP flow with a 4 MiB window moves at that round trip
// (flowLimit; FERRY_S3_WINDOW). Targets: ≥ 1 on
// loopback, ≥ 4 at 40 ms. On a 16-core H200 host, one run each: the 2 GB
// file in 4.62 s (433 MB/s) against PutObject's 10.51 s (190 MB/s), x-put
// 2.27; the 5000 files in 1.42 s against 6.63 s, 4.67. At
// FERRY_S3_RTT_MS=40 (each connection bounded to 105 MB/s): the 2 GB file
// in 4.68 s against 22.29 s, 4.76; 500 files in 1.59 s against 21.78 s,
// 13.7.
func BenchmarkTransferS3(b *testing.B) {
	size := envInt(b, "FERRY_S3_SIZE", 2e9)
	if size > 5<<30 {
		b.Fatalf("FERRY_S3_SIZE=%d: over one PutObject's 5 GiB", size)
	}
	files := int(envInt(b, "FERRY_TREE_FILES", 5000))
	const bucket = "bench"
	srv := s3test.Start(b, bucket)
	srv.Env(b)
	c := srv.Client()
	c = proxiedS3(b, srv, c)
	run := 0
	fresh := func() string { run++; return fmt.Sprintf("run%d", run) }
	for _, tc := range []struct {
		name string
		make func(b *testing.B, src string)
	}{
		{"file", func(b *testing.B, src string) { randomFile(b, filepath.Join(src, "model.gguf"), size, 3) }},
		{"tree", func(b *testing.B, src string) { smallTree(b, src, files, 500, 4) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			src := filepath.Join(b.TempDir(), "src")
			tc.make(b, src)
			var bytes int64
			filepath.WalkDir(src, func(p string, de fs.DirEntry, err error) error {
				if err == nil && de.Type().IsRegular() {
					fi, _ := de.Info()
					bytes += fi.Size()
				}
				return nil
			})
			var putSec float64
			b.Run("putobject", func(b *testing.B) {
				var total time.Duration
				for range b.N {
					prefix := fresh()
					t0 := time.Now()
					err := filepath.WalkDir(src, func(p string, de fs.DirEntry, err error) error {
						if err != nil || !de.Type().IsRegular() {
							return err
						}
						rel, _ := filepath.Rel(src, p)
						f, err := os.Open(p)
						if err != nil {
							return err
						}
						defer f.Close()
						fi, _ := f.Stat()
						_, err = c.PutObject(context.Background(), &s3api.PutObjectInput{Bucket: aws.String(bucket),
							Key: aws.String(prefix + "/" + filepath.ToSlash(rel)), Body: f, ContentLength: aws.Int64(fi.Size())})
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
					total += time.Since(t0)
					os.RemoveAll(srv.ObjectPath(bucket, prefix))
				}
				putSec = total.Seconds() / float64(b.N)
				b.ReportMetric(putSec, "s/run")
				b.ReportMetric(float64(bytes)/putSec/1e6, "MB/s")
				b.ReportMetric(1, "x-put")
			})
			b.Run("ferry", func(b *testing.B) {
				var total time.Duration
				for range b.N {
					prefix := fresh()
					t0 := time.Now()
					cache := OpenDigestCache(filepath.Join(b.TempDir(), DigestCacheFile))
					p, err := NewPlan(context.Background(), []string{src}, PlanOptions{Cache: cache})
					if err != nil {
						b.Fatal(err)
					}
					url := "s3://" + bucket + "/" + prefix
					rep, err := Run(context.Background(), p, []Destination{{Name: url, Dir: url, S3: true}}, Options{StateDir: b.TempDir()})
					if err != nil {
						b.Fatal(err)
					}
					total += time.Since(t0)
					if rep.Hosts[0].Sent != bytes {
						b.Fatalf("sent %d of %d bytes", rep.Hosts[0].Sent, bytes)
					}
					os.RemoveAll(srv.ObjectPath(bucket, prefix))
				}
				sec := total.Seconds() / float64(b.N)
				b.ReportMetric(sec, "s/run")
				b.ReportMetric(float64(bytes)/sec/1e6, "MB/s")
				if putSec > 0 {
					b.ReportMetric(putSec/sec, "x-put")
				}
			})
		})
	}
}

// envInt is the positive integer in the environment variable name, or def
// where it is not set.
func envInt(b testing.TB, name string, def int64) int64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}
