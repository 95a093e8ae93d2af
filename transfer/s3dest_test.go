package transfer

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/s3test"
)

// A destination list mixing an SSH host, a local directory and an S3
// prefix: every one gets the tree, each piece of every source file is read
// once for all three, and a second run sends nothing.
func TestS3DestMixed(t *testing.T) {
	srv := s3test.Start(t, "mixed")
	srv.Env(t)
	sshd := startSSHD(t)
	src := filepath.Join(t.TempDir(), "tree")
	smallTree(t, src, 40, 20, 4)
	randomFile(t, filepath.Join(src, "big.bin"), 11<<20+5, 5) // 3 chunks of 5 MiB
	hostDir, localDir := t.TempDir(), t.TempDir()
	dests := []Destination{
		{Name: "h:" + hostDir, Host: "h", Dir: hostDir, Dial: testDialer(sshd, sshd.Addr())},
		{Name: localDir, Dir: localDir, Local: true},
		{Name: "s3://mixed/m", Dir: "s3://mixed/m", S3: true},
	}
	p, err := NewPlan(context.Background(), []string{src}, PlanOptions{ChunkSize: 5 << 20})
	if err != nil {
		t.Fatal(err)
	}
	reads := countSourceReads(t)
	state := t.TempDir()
	rep, err := Run(context.Background(), p, dests, Options{StateDir: state, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, f := range p.Files {
		want += max(1, f.Chunks(p.ChunkSize))
	}
	if len(reads) != want {
		t.Errorf("%d pieces read, want %d", len(reads), want)
	}
	for k, n := range reads {
		if n != 1 {
			t.Errorf("%s read %d times for three destinations, want once", k, n)
		}
	}
	for _, dir := range []string{hostDir, localDir, srv.ObjectPath("mixed", "m")} {
		sameTree(t, src, filepath.Join(dir, "tree"))
	}
	for _, h := range rep.Hosts {
		if !h.OK || h.Sent != p.Bytes() {
			t.Errorf("%s: OK %v, sent %d of %d", h.Destination, h.OK, h.Sent, p.Bytes())
		}
	}
	clear(reads)
	rep, err = Run(context.Background(), p, dests, Options{StateDir: state, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range rep.Hosts {
		if !h.OK || h.Sent != 0 {
			t.Errorf("rerun: %s: OK %v, sent %d", h.Destination, h.OK, h.Sent)
		}
	}
	// The connection's check and one listing: every object is trusted by
	// the Last-Modified the first run relisted (a put answers none).
	if n := rep.Hosts[2].Requests; n > 2 {
		t.Errorf("rerun: %d S3 requests, want 2 (open, one listing)", n)
	}
	if len(reads) != 0 {
		t.Errorf("the rerun read %d pieces of the sources", len(reads))
	}
}

// An S3 destination that cannot be used fails alone, before a byte is
// sent to it, with an error naming it, of the kind that gives the right
// exit code; the local directory beside it gets the file.
func TestS3DestBadCases(t *testing.T) {
	srv := s3test.Start(t, "bad")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	cases := []struct {
		name string
		url  string
		env  map[string]string
		cs   int64
		kind errkind.Kind
		want string
	}{
		{name: "no such bucket", url: "s3://nosuchbucket/x", kind: errkind.BadInput, want: `bucket "nosuchbucket" does not exist`},
		{name: "credentials refused", url: "s3://bad/x", env: map[string]string{"AWS_SECRET_ACCESS_KEY": "wrong"}, kind: errkind.Usage, want: "refused the credentials"},
		{name: "unknown access key", url: "s3://bad/x", env: map[string]string{"AWS_ACCESS_KEY_ID": "nobody"}, kind: errkind.Usage, want: "refused the credentials"},
		{name: "endpoint unreachable", url: "s3://bad/x", env: map[string]string{"AWS_ENDPOINT_URL_S3": closed}, kind: errkind.Usage, want: "cannot reach the S3 endpoint"},
		{name: "chunk under 5 MiB", url: "s3://bad/x", cs: 1 << 20, kind: errkind.Usage, want: "5 MiB minimum part size"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv.Env(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			src := filepath.Join(t.TempDir(), "w.bin")
			randomFile(t, src, 2<<20, 6)
			local := t.TempDir()
			cs := tc.cs
			if cs == 0 {
				cs = 1 << 20
			}
			p, err := NewPlan(context.Background(), []string{src}, PlanOptions{ChunkSize: cs})
			if err != nil {
				t.Fatal(err)
			}
			dests := []Destination{{Name: local, Dir: local, Local: true}, {Name: tc.url, Dir: tc.url, S3: true}}
			rep, err := Run(context.Background(), p, dests, Options{StateDir: t.TempDir(), Log: testLog(t)})
			if err == nil {
				t.Fatal("no error")
			}
			t.Logf("error: %v", err)
			if k := errkind.Of(err); k != tc.kind {
				t.Errorf("kind %v, want %v", k, tc.kind)
			}
			if msg := err.Error(); !strings.Contains(msg, tc.want) || !strings.Contains(msg, tc.url) {
				t.Errorf("error %q does not name %s and %q", msg, tc.url, tc.want)
			}
			if !rep.Hosts[0].OK || rep.Hosts[1].OK || rep.Hosts[1].Sent != 0 {
				t.Errorf("want the local directory done and nothing sent to S3: %+v", rep.Hosts)
			}
			if _, err := os.Stat(filepath.Join(local, "w.bin")); err != nil {
				t.Error(err)
			}
		})
	}
}

// Without Verify an object is what its metadata (x-amz-meta-ferry-sha256)
// says; with it, its bytes are read again (ranged GETs), and an object
// whose bytes changed behind the server (its file on the gateway's disk,
// as a failing disk would) is found and sent again.
func TestS3DestVerifyRehashes(t *testing.T) {
	srv := s3test.Start(t, "verify")
	srv.Env(t)
	src := filepath.Join(t.TempDir(), "m")
	want := randomFile(t, filepath.Join(src, "big.bin"), 6<<20, 7)
	randomFile(t, filepath.Join(src, "small.bin"), 1000, 8)
	p, err := NewPlan(context.Background(), []string{src}, PlanOptions{ChunkSize: 5 << 20})
	if err != nil {
		t.Fatal(err)
	}
	d := Destination{Name: "s3://verify/p", Dir: "s3://verify/p", S3: true}
	state := t.TempDir()
	if _, err := Run(context.Background(), p, []Destination{d}, Options{StateDir: state, Log: testLog(t)}); err != nil {
		t.Fatal(err)
	}
	obj := srv.ObjectPath("verify", "p/m/big.bin")
	f, err := os.OpenFile(obj, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{want[5<<20+10] ^ 1}, 5<<20+10)
	f.Close()
	for _, verify := range []bool{false, true} {
		rep, err := Run(context.Background(), p, []Destination{d}, Options{StateDir: state, Log: testLog(t), Verify: verify})
		if err != nil {
			t.Fatal(err)
		}
		h := rep.Hosts[0]
		switch {
		case !verify && h.Sent != 0:
			t.Errorf("without verify: sent %d; the metadata should have been trusted", h.Sent)
		case verify && h.Sent != int64(len(want)):
			t.Errorf("with verify: sent %d, want big.bin's %d", h.Sent, len(want))
		}
	}
	got, _ := os.ReadFile(obj)
	if string(got) != string(want) {
		t.Error("big.bin differs after the verified run")
	}
}

// A plan whose files are hashed as they are sent (HashLater) has them
// hashed before sending where an S3 prefix receives them (an upload is
// created with the file's sha256): every object, a multipart upload's
// too, carries it in its metadata.
func TestS3DestHashLater(t *testing.T) {
	srv := s3test.Start(t, "later")
	srv.Env(t)
	src := filepath.Join(t.TempDir(), "m")
	randomFile(t, filepath.Join(src, "big.bin"), 11<<20+5, 14) // 3 parts of 5 MiB
	randomFile(t, filepath.Join(src, "small.bin"), 1000, 15)
	var hashed atomic.Int64
	p, err := NewPlan(context.Background(), []string{src}, PlanOptions{ChunkSize: 5 << 20, HashLater: true, Hashed: func(n int64) { hashed.Add(n) }})
	if err != nil {
		t.Fatal(err)
	}
	if hashed.Load() != 0 {
		t.Fatalf("%d bytes hashed while planning", hashed.Load())
	}
	d := Destination{Name: "s3://later/p", Dir: "s3://later/p", S3: true}
	if _, err := Run(context.Background(), p, []Destination{d}, Options{StateDir: t.TempDir(), Log: testLog(t)}); err != nil {
		t.Fatal(err)
	}
	if hashed.Load() != p.Bytes() {
		t.Errorf("%d bytes hashed before sending, want all %d", hashed.Load(), p.Bytes())
	}
	for _, n := range []string{"big.bin", "small.bin"} {
		h, err := srv.Client().HeadObject(context.Background(), &s3api.HeadObjectInput{Bucket: aws.String("later"), Key: aws.String("p/m/" + n)})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := h.Metadata[s3MetaSHA256], fileDigest(t, filepath.Join(src, n)).Hex(); got != want {
			t.Errorf("%s: metadata sha256 %q, want %q", n, got, want)
		}
	}
}
