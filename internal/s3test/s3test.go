// Package s3test starts a real S3 server for tests: versitygw (a gateway
// that serves a directory as S3) on 127.0.0.1 at a free port, with its
// posix root in t.TempDir(), root credentials chosen by the test, and a
// bucket made through the S3 API; it stops when the test ends.
//
// The binary is found at $FERRY_VERSITYGW, else in the module's
// .tools/bin (`make tools` installs it there), else on PATH. Where it is
// missing the test is skipped with the make tools hint, except under
// CI=true, where it fails: .ci/run installs it, so a skip there would hide
// a broken setup.
package s3test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// Version is the versitygw release the tests are written against: the
// Makefile's VERSITYGW_VERSION. 1.8.0 makes racing conditional writes
// atomic (earlier releases let two If-None-Match writers both win).
const Version = "v1.8.0"

// Region is the region the server answers for (versitygw's default).
const Region = "us-east-1"

// Server is a running versitygw.
type Server struct {
	Endpoint  string // "http://127.0.0.1:PORT"
	AccessKey string
	SecretKey string
	Bucket    string // made by Start
	// Root is the posix directory the gateway serves: bucket B's object K
	// is the file Root/B/K. Tests reach behind the server through it (to
	// damage an object's bytes, as a failing disk would).
	Root string

	cmd  *exec.Cmd
	log  *syncBuffer
	done chan struct{}
	stop sync.Once
}

// Binary returns the versitygw binary to run, or "" with the reason.
func Binary() (string, string) {
	if p := os.Getenv("FERRY_VERSITYGW"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Sprintf("FERRY_VERSITYGW=%s: %v", p, err)
		}
		return p, ""
	}
	if root := moduleRoot(); root != "" {
		p := filepath.Join(root, ".tools", "bin", "versitygw")
		if _, err := os.Stat(p); err == nil {
			return p, ""
		}
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, ""
	}
	return "", "versitygw not found in .tools/bin or on PATH: run `make tools` (installs versitygw " + Version + " into .tools/bin)"
}

// moduleRoot is the directory holding go.mod above the working directory
// (a package's test runs in its own directory).
func moduleRoot() string {
	d, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		p := filepath.Dir(d)
		if p == d {
			return ""
		}
		d = p
	}
}

// Start starts a server with one bucket, named bucket, and registers its
// stop with t.Cleanup.
func Start(t testing.TB, bucket string) *Server {
	t.Helper()
	bin, why := Binary()
	if bin == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("s3test: %s", why)
		}
		t.Skipf("s3test: %s", why)
	}
	dir := t.TempDir()
	if d := os.Getenv("FERRY_S3TEST_DIR"); d != "" {
		// A benchmark's choice of the server's disk (a tmpfs: the
		// server's writes off the disk the code under test uses).
		var err error
		if dir, err = os.MkdirTemp(d, "s3test-"); err != nil {
			t.Fatalf("s3test: FERRY_S3TEST_DIR=%s: %v", d, err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	var lastErr error
	// A free port found by listening on :0 can be taken again before the
	// server binds it; try a few.
	for range 5 {
		s, err := start(bin, root, dir)
		if err == nil {
			t.Cleanup(s.Stop)
			if err := s.MakeBucket(context.Background(), bucket); err != nil {
				t.Fatalf("s3test: make bucket %s: %v\n%s", bucket, err, s.log.String())
			}
			s.Bucket = bucket
			return s
		}
		lastErr = err
	}
	t.Fatalf("s3test: start versitygw: %v", lastErr)
	return nil
}

func start(bin, root, dir string) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &Server{
		Endpoint:  "http://127.0.0.1:" + strconv.Itoa(port),
		AccessKey: "ferrytest",
		SecretKey: "ferrytest-secret-" + strconv.Itoa(port),
		Root:      root,
		log:       &syncBuffer{},
		done:      make(chan struct{}),
	}
	// Keep-alive, as S3 services serve: a client reuses its connections.
	args := []string{"--port", "127.0.0.1:" + strconv.Itoa(port), "--quiet", "--keep-alive", "posix"}
	// FERRY_S3TEST_POSIX_FLAGS: a benchmark's choice of the posix backend's
	// options (e.g. --data-integrity-etag), as a deployment would set them.
	args = append(args, strings.Fields(os.Getenv("FERRY_S3TEST_POSIX_FLAGS"))...)
	s.cmd = exec.Command(bin, append(args, root)...)
	s.cmd.Dir = dir
	// Only what the server needs: no AWS_* or VGW_* settings of the user's.
	s.cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + dir,
		"ROOT_ACCESS_KEY=" + s.AccessKey,
		"ROOT_SECRET_KEY=" + s.SecretKey,
	}
	s.cmd.Stdout = s.log
	s.cmd.Stderr = s.log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-s.done:
			return nil, fmt.Errorf("versitygw exited: %s", s.log.String())
		default:
		}
		// Any HTTP answer (403 to an unsigned request) means it serves.
		resp, err := http.Get(s.Endpoint + "/")
		if err == nil {
			resp.Body.Close()
			return s, nil
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("versitygw did not answer within 15 s: %v\n%s", err, s.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Stop ends the server and waits for it.
func (s *Server) Stop() {
	s.stop.Do(func() {
		if s.cmd.Process != nil {
			s.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-s.done:
			case <-time.After(5 * time.Second):
				s.cmd.Process.Kill()
				<-s.done
			}
		}
	})
}

// CPU is the processor time the server has used so far (user and
// system), read from /proc: 0 where there is none.
func (s *Server) CPU() time.Duration {
	if s.cmd.Process == nil {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// After the command name's closing parenthesis: state is field 3,
	// utime and stime fields 14 and 15, in clock ticks (USER_HZ, 100 on
	// Linux).
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+k) * 10 * time.Millisecond
}

// Log is what the server printed.
func (s *Server) Log() string { return s.log.String() }

// Client is an S3 client for the server, for tests that arrange objects
// behind the code under test's back.
func (s *Server) Client() *s3.Client {
	return s3.New(s3.Options{
		Region:       Region,
		BaseEndpoint: aws.String(s.Endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
		// Explicit checksums only: the default CRC32 trailers are what
		// several S3-compatible servers reject.
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
	})
}

// MakeBucket makes another bucket.
func (s *Server) MakeBucket(ctx context.Context, name string) error {
	_, err := s.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)})
	return err
}

// ObjectPath is the file holding bucket's object key on the server's disk.
func (s *Server) ObjectPath(bucket, key string) string {
	return filepath.Join(s.Root, bucket, filepath.FromSlash(key))
}

// Env sets the standard AWS settings every S3 tool reads so that a client
// configured from the environment reaches this server with its root
// credentials, and points the shared config and credentials files at
// files that do not exist (the user's ~/.aws must not leak into a test).
func (s *Server) Env(t testing.TB) {
	t.Helper()
	Isolate(t)
	t.Setenv("AWS_ENDPOINT_URL_S3", s.Endpoint)
	t.Setenv("AWS_ACCESS_KEY_ID", s.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s.SecretKey)
	t.Setenv("AWS_REGION", Region)
}

// Isolate clears every AWS setting of the environment the test runs in
// and points the shared config and credentials files into t.TempDir().
func Isolate(t testing.TB) {
	t.Helper()
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "AWS_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	d := t.TempDir()
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(d, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(d, "credentials"))
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.b.Len() > 1<<20 {
		return len(p), nil
	}
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
