package s3test

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// The server serves its root directory: an object put through the API is
// the file ObjectPath names, and a second server is a separate world.
func TestStart(t *testing.T) {
	s := Start(t, "bucket-one")
	ctx := context.Background()
	c := s.Client()
	body := []byte("hello, store")
	if _, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("bucket-one"), Key: aws.String("a/b.txt"), Body: bytes.NewReader(body)}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(s.ObjectPath("bucket-one", "a/b.txt"))
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("object file: %q, %v", got, err)
	}
	out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("bucket-one"), Key: aws.String("a/b.txt")})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(out.Body)
	out.Body.Close()
	if !bytes.Equal(b, body) {
		t.Fatalf("GET: %q", b)
	}
	// It has started, made a bucket and served three requests: some
	// processor time, and far from a minute of it (a misread field).
	if cpu := s.CPU(); runtime.GOOS == "linux" && (cpu <= 0 || cpu > time.Minute) {
		t.Errorf("CPU: %v", cpu)
	}
	s2 := Start(t, "bucket-one")
	if s2.Endpoint == s.Endpoint {
		t.Fatal("two servers on one endpoint")
	}
	if _, err := s2.Client().HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("bucket-one"), Key: aws.String("a/b.txt")}); err == nil {
		t.Fatal("second server sees the first one's object")
	}
	s.Stop()
	if _, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("bucket-one"), Key: aws.String("a/b.txt")}); err == nil {
		t.Fatal("stopped server still answers")
	}
}

// Under CI=true a missing binary fails the test; otherwise it skips with
// the make tools hint. Run in a child process, since the outcome is the
// test's own.
func TestMissingBinary(t *testing.T) {
	if os.Getenv("S3TEST_CHILD") == "1" {
		Start(t, "bucket")
		t.Fatal("Start returned without a binary")
	}
	for _, tc := range []struct {
		ci       string
		wantFail bool
		want     string
	}{
		{"true", true, "--- FAIL"},
		{"", false, "--- SKIP"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMissingBinary$", "-test.v")
		cmd.Env = append(os.Environ(), "S3TEST_CHILD=1", "CI="+tc.ci, "FERRY_VERSITYGW=/nonexistent/versitygw")
		out, err := cmd.CombinedOutput()
		if (err != nil) != tc.wantFail || !strings.Contains(string(out), tc.want) || !strings.Contains(string(out), "FERRY_VERSITYGW=/nonexistent/versitygw") {
			t.Errorf("CI=%q: err %v, output:\n%s", tc.ci, err, out)
		}
	}
}
