package s3_test

import (
	"context"
	"crypto/md5"
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/s3client"
	"github.com/ferry-llm/ferry/internal/s3test"
	"github.com/ferry-llm/ferry/store"
	s3store "github.com/ferry-llm/ferry/store/s3"
	"github.com/ferry-llm/ferry/store/storetest"
)

// The conformance suite against a real versitygw, each test in a prefix
// of its own: as it starts by default (ETags are MD5s), and with
// --data-integrity-etag (ETags from CRC64NVME, no MD5 of every byte: the
// setting README suggests for a gateway that serves ferry).
func TestConformance(t *testing.T) {
	for _, tc := range []struct{ name, flags string }{
		{"default", ""},
		{"data-integrity-etag", "--data-integrity-etag"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("FERRY_S3TEST_POSIX_FLAGS", tc.flags)
			conformance(t, tc.flags != "")
		})
	}
}

func conformance(t *testing.T, integrityETags bool) {
	srv := s3test.Start(t, "ferry-store")
	srv.Env(t)
	// The gateway runs as asked: its ETag of a body is the body's MD5
	// only by default.
	b, err := s3store.Open(context.Background(), "s3://ferry-store/etag")
	if err != nil {
		t.Fatal(err)
	}
	body := []byte("ferry")
	in, err := b.Put(context.Background(), "k", body, store.PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if md5ETag := fmt.Sprintf("%q", fmt.Sprintf("%x", md5.Sum(body))); (in.ETag == md5ETag) == integrityETags {
		t.Fatalf("ETag %s (the body's MD5 is %s): the gateway's flags %q were not applied", in.ETag, md5ETag, os.Getenv("FERRY_S3TEST_POSIX_FLAGS"))
	}
	var n atomic.Int64
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) store.Backend {
			b, err := s3store.Open(context.Background(), fmt.Sprintf("s3://ferry-store/t%d/store", n.Add(1)))
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		Damage: func(t *testing.T, b store.Backend, key string) {
			sb := b.(*s3store.Backend)
			storetest.DamageFile(t, srv.ObjectPath(sb.Bucket(), sb.ObjectKey(key)))
		},
		// versitygw's Last-Modified is its file's modification time.
		Age: func(t *testing.T, b store.Backend, key string, d time.Duration) {
			sb := b.(*s3store.Backend)
			storetest.AgeFile(t, srv.ObjectPath(sb.Bucket(), sb.ObjectKey(key)), d)
		},
		// Dates have whole seconds.
		LeaseTTL: 3 * time.Second,
	})
}

// Settings come from where every S3 tool reads them; wrong ones are
// usage or bad-input errors that name the setting, at once, not retried.
func TestSettings(t *testing.T) {
	srv := s3test.Start(t, "ferry-settings")
	ctx := context.Background()
	closed := closedEndpoint(t)
	for _, tc := range []struct {
		name string
		env  map[string]string
		// files: ~/.aws/config and credentials
		config, credentials string
		url                 string
		kind                errkind.Kind // 0 with want "": opens
		want                string
	}{
		{name: "AWS_ENDPOINT_URL_S3", env: map[string]string{"AWS_ENDPOINT_URL_S3": srv.Endpoint, "AWS_ACCESS_KEY_ID": srv.AccessKey, "AWS_SECRET_ACCESS_KEY": srv.SecretKey, "AWS_REGION": "us-east-1"}},
		{name: "AWS_ENDPOINT_URL, no region", env: map[string]string{"AWS_ENDPOINT_URL": srv.Endpoint, "AWS_ACCESS_KEY_ID": srv.AccessKey, "AWS_SECRET_ACCESS_KEY": srv.SecretKey}},
		{name: "AWS_PROFILE with config and credentials files", env: map[string]string{"AWS_PROFILE": "lab"},
			config:      "[profile lab]\nregion = us-east-1\nendpoint_url = " + srv.Endpoint + "\n",
			credentials: "[lab]\naws_access_key_id = " + srv.AccessKey + "\naws_secret_access_key = " + srv.SecretKey + "\n"},
		{name: "wrong secret", env: map[string]string{"AWS_ENDPOINT_URL_S3": srv.Endpoint, "AWS_ACCESS_KEY_ID": srv.AccessKey, "AWS_SECRET_ACCESS_KEY": "wrong"},
			kind: errkind.Usage, want: "refused the credentials"},
		{name: "unknown access key", env: map[string]string{"AWS_ENDPOINT_URL_S3": srv.Endpoint, "AWS_ACCESS_KEY_ID": "nobody", "AWS_SECRET_ACCESS_KEY": "wrong"},
			kind: errkind.Usage, want: "refused the credentials"},
		{name: "no credentials", env: map[string]string{"AWS_ENDPOINT_URL_S3": srv.Endpoint},
			kind: errkind.Usage, want: "no S3 credentials"},
		{name: "missing bucket", url: "s3://no-such-bucket/x", env: map[string]string{"AWS_ENDPOINT_URL_S3": srv.Endpoint, "AWS_ACCESS_KEY_ID": srv.AccessKey, "AWS_SECRET_ACCESS_KEY": srv.SecretKey},
			kind: errkind.BadInput, want: `bucket "no-such-bucket" does not exist`},
		{name: "unreachable endpoint", env: map[string]string{"AWS_ENDPOINT_URL_S3": closed, "AWS_ACCESS_KEY_ID": srv.AccessKey, "AWS_SECRET_ACCESS_KEY": srv.SecretKey},
			kind: errkind.Usage, want: "cannot reach the S3 endpoint " + closed},
		{name: "silent endpoint", env: map[string]string{"AWS_ENDPOINT_URL_S3": silentEndpoint(t), "AWS_ACCESS_KEY_ID": srv.AccessKey, "AWS_SECRET_ACCESS_KEY": srv.SecretKey},
			kind: errkind.Usage, want: "accepted a connection but gave no answer within 1s"},
		{name: "https to a plain-HTTP endpoint", env: map[string]string{"AWS_ENDPOINT_URL_S3": strings.Replace(srv.Endpoint, "http://", "https://", 1), "AWS_ACCESS_KEY_ID": srv.AccessKey, "AWS_SECRET_ACCESS_KEY": srv.SecretKey},
			kind: errkind.Usage, want: "it answers plain HTTP to https:// (write the endpoint as http://…)"},
		{name: "endpoint without a scheme", env: map[string]string{"AWS_ENDPOINT_URL_S3": strings.TrimPrefix(srv.Endpoint, "http://"), "AWS_ACCESS_KEY_ID": srv.AccessKey, "AWS_SECRET_ACCESS_KEY": srv.SecretKey},
			kind: errkind.Usage, want: "want a URL like http://HOST:PORT"},
		{name: "bucket name refused", url: "s3://Models/x", env: map[string]string{"AWS_ENDPOINT_URL_S3": srv.Endpoint, "AWS_ACCESS_KEY_ID": srv.AccessKey, "AWS_SECRET_ACCESS_KEY": srv.SecretKey},
			kind: errkind.Usage, want: `refuses the bucket name "Models"`},
		{name: "not an s3 URL", url: "http://x/y", kind: errkind.Usage, want: "not an s3:// URL"},
		{name: "no bucket", url: "s3:///x", kind: errkind.Usage, want: "no bucket"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s3test.Isolate(t)
			t.Setenv("AWS_RETRY_MODE", "")
			if tc.config != "" {
				os.WriteFile(os.Getenv("AWS_CONFIG_FILE"), []byte(tc.config), 0o600)
			}
			if tc.credentials != "" {
				os.WriteFile(os.Getenv("AWS_SHARED_CREDENTIALS_FILE"), []byte(tc.credentials), 0o600)
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			url := tc.url
			if url == "" {
				url = "s3://ferry-settings/p"
			}
			defer func(d time.Duration) { s3client.OpenTimeout = d }(s3client.OpenTimeout)
			s3client.OpenTimeout = time.Second
			start := time.Now()
			b, err := s3store.Open(ctx, url)
			took := time.Since(start)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if _, err := b.Put(ctx, "x", []byte("x"), store.PutOptions{}); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || errkind.Of(err) != tc.kind {
				t.Fatalf("got %v (kind %v), want %q (kind %v)", err, errkind.Of(err), tc.want, tc.kind)
			}
			if took > 3*time.Second {
				t.Errorf("took %v: retried what will not pass", took)
			}
		})
	}
}

// silentEndpoint is an http:// endpoint on 127.0.0.1 that accepts
// connections and never answers.
func silentEndpoint(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	return "http://" + l.Addr().String()
}

// closedEndpoint is an http:// endpoint on 127.0.0.1 where nothing listens.
func closedEndpoint(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

func TestParseURL(t *testing.T) {
	for _, tc := range []struct{ url, bucket, prefix string }{
		{"s3://b", "b", ""},
		{"s3://b/", "b", ""},
		{"s3://b/p", "b", "p/"},
		{"s3://b/p/q/", "b", "p/q/"},
	} {
		b, p, err := s3store.ParseURL(tc.url)
		if err != nil || b != tc.bucket || p != tc.prefix {
			t.Errorf("%s: %q %q %v", tc.url, b, p, err)
		}
	}
	for _, u := range []string{"s3://", "s3:///p", "s3://b/a/../p", "s3://b/./p", "s3://b/p/..", "b/p"} {
		if _, _, err := s3store.ParseURL(u); errkind.Of(err) != errkind.Usage {
			t.Errorf("%s: %v, want a usage error", u, err)
		}
	}
}
