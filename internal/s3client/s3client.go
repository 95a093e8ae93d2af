// Package s3client connects to S3-compatible object storage (AWS S3,
// Cloudflare R2, Backblaze B2, Ceph RGW, MinIO, versitygw …) at
// s3://BUCKET/PREFIX, for both the store's S3 backend (store/s3) and
// transfer's S3 destination: one place that reads the settings and tells
// errors apart. It lives under internal/ because transfer and store are
// siblings that must not import each other.
//
// Endpoint, region and credentials are read the way every S3 tool reads
// them (aws-sdk-go-v2's config): AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL,
// AWS_REGION, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE,
// ~/.aws/config and ~/.aws/credentials. A custom endpoint is addressed
// path-style (http://host/bucket/key), which every S3-compatible server
// serves. Checksums are sent only where the caller gives them (SHA-256 on
// every put and part, so the server rejects a body that does not match),
// never the SDK's default CRC32 trailers, which several S3-compatible
// servers refuse.
//
// Errors carry errkind kinds: wrong credentials and an unreachable
// endpoint are usage errors, a missing bucket is bad input, none of them
// retried; throttling, 5xx answers and dropped connections are retried by
// the SDK and then Retryable. Answers a caller acts on (a failed
// condition, an unknown upload or key, a body that did not match its
// checksum) are an *Error with its Code.
package s3client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	smithymiddleware "github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/ferry-llm/ferry/internal/errkind"
)

// DefaultRegion is used when no setting names one: what S3-compatible
// servers answer for, and AWS's default.
const DefaultRegion = "us-east-1"

// Client is a bucket and a key prefix on one endpoint.
type Client struct {
	API      *s3api.Client
	Bucket   string
	Prefix   string // "" or ending in "/"
	Endpoint string // for messages: the custom endpoint, or "AWS S3"
	retries  atomic.Int64
	// opened: the endpoint answered Open; one that cannot be reached
	// after is an outage that may pass, not a wrong setting.
	opened atomic.Bool
}

// Retries is how many requests (and cut-off answers) were tried again.
func (c *Client) Retries() int64 { return c.retries.Load() }

// Retried counts a retry the caller made itself (a cut-off body asked
// again).
func (c *Client) Retried() { c.retries.Add(1) }

// countingRetryer counts the retries its retryer grants.
type countingRetryer struct {
	aws.Retryer
	n *atomic.Int64
}

func (r countingRetryer) RetryDelay(attempt int, err error) (time.Duration, error) {
	r.n.Add(1)
	return r.Retryer.RetryDelay(attempt, err)
}

// ParseURL splits "s3://BUCKET[/PREFIX]"; prefix is "" or ends in "/".
func ParseURL(u string) (bucket, prefix string, err error) {
	rest, ok := strings.CutPrefix(u, "s3://")
	if !ok {
		return "", "", errkind.Errorf(errkind.Usage, "%q: not an s3:// URL", u)
	}
	bucket, prefix, _ = strings.Cut(rest, "/")
	if bucket == "" {
		return "", "", errkind.Errorf(errkind.Usage, "%q: no bucket (want s3://BUCKET/PREFIX)", u)
	}
	prefix = strings.Trim(prefix, "/")
	for _, el := range strings.Split(prefix, "/") {
		if el == "." || el == ".." {
			// S3 keeps them as written; a gateway over a file system may
			// resolve them: the same URL would name two places.
			return "", "", errkind.Errorf(errkind.Usage, "%q: a prefix with %q in it: write the prefix without . or .. segments", u, el)
		}
	}
	if prefix != "" {
		prefix += "/"
	}
	return bucket, prefix, nil
}

// IsURL reports whether s names a place in S3.
func IsURL(s string) bool { return strings.HasPrefix(s, "s3://") }

// Options tune the connection; the zero value is the default.
type Options struct {
	// StallTimeout ends a connection that delivers no byte for this long
	// (a stalled link, a server that hung), and the request is retried
	// (DefaultStallTimeout when 0).
	StallTimeout time.Duration
}

// DefaultStallTimeout is Options.StallTimeout's default.
const DefaultStallTimeout = time.Minute

// Open connects to url ("s3://BUCKET/PREFIX") with the standard settings,
// and checks that the credentials work and the bucket exists: a wrong
// setting is an error here, not at the first write.
func Open(ctx context.Context, url string, opt Options) (*Client, error) {
	bucket, prefix, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	if opt.StallTimeout <= 0 {
		opt.StallTimeout = DefaultStallTimeout
	}
	httpClient := awshttp.NewBuildableClient().
		WithReadTimeout(opt.StallTimeout).
		WithDialerOptions(func(d *net.Dialer) { d.Timeout = 15 * time.Second })
	c := &Client{Bucket: bucket, Prefix: prefix, Endpoint: "AWS S3"}
	cfg, err := config.LoadDefaultConfig(ctx,
		config.WithHTTPClient(httpClient),
		config.WithRetryer(func() aws.Retryer { return countingRetryer{newRetryer(), &c.retries} }),
		config.WithRequestChecksumCalculation(aws.RequestChecksumCalculationWhenRequired),
		config.WithResponseChecksumValidation(aws.ResponseChecksumValidationWhenRequired),
	)
	if err != nil {
		return nil, errkind.Errorf(errkind.Usage, "%s: S3 settings (AWS_* variables, AWS_PROFILE, ~/.aws/config): %w", url, err)
	}
	if cfg.Region == "" {
		cfg.Region = DefaultRegion
	}
	c.API = s3api.NewFromConfig(cfg, func(o *s3api.Options) {
		if o.BaseEndpoint != nil {
			o.UsePathStyle = true
			c.Endpoint = *o.BaseEndpoint
		}
	})
	if c.Endpoint != "AWS S3" && !strings.HasPrefix(c.Endpoint, "http://") && !strings.HasPrefix(c.Endpoint, "https://") {
		return nil, errkind.Errorf(errkind.Usage, "%s: S3 endpoint %q (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL or the profile's endpoint_url): want a URL like http://HOST:PORT or https://HOST", url, c.Endpoint)
	}
	if _, err := cfg.Credentials.Retrieve(ctx); err != nil {
		return nil, errkind.Errorf(errkind.Usage, "%s: no S3 credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with ~/.aws/credentials): %w", url, err)
	}
	// A listing, not a HEAD: its error answers carry a code (a HEAD's
	// carry only a status, and some servers answer 404 to unknown keys).
	octx, cancel := context.WithTimeout(ctx, OpenTimeout)
	defer cancel()
	if _, err := c.API.ListObjectsV2(octx, &s3api.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(prefix), MaxKeys: aws.Int32(1)}); err != nil {
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return nil, errkind.Errorf(errkind.Usage, "%s: the S3 endpoint %s accepted a connection but gave no answer within %v (is it an S3 server? check AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL)", c, c.Endpoint, OpenTimeout)
		}
		return nil, c.Classify("open", "", err)
	}
	c.opened.Store(true)
	return c, nil
}

// OpenTimeout bounds Open's first listing, retries included: an endpoint
// that takes a connection and never answers is reported, not waited on.
// A variable for tests.
var OpenTimeout = 30 * time.Second

// newRetryer is the SDK's standard retryer with more attempts, no retry
// quota (a long transfer over a flaky link must not run out of retries
// for good), racing conditional writes (409) retried, and nothing retried
// that will not pass by itself: a refused connection or an unknown host.
func newRetryer() aws.Retryer {
	return retry.NewStandard(func(o *retry.StandardOptions) {
		o.MaxAttempts = 6
		o.MaxBackoff = 5 * time.Second
		o.RateLimiter = ratelimit.None
		o.Retryables = append([]retry.IsErrorRetryable{
			retry.IsErrorRetryableFunc(func(err error) aws.Ternary {
				if unreachable(err) || tlsMisfit(err) != "" {
					return aws.FalseTernary
				}
				var ae smithy.APIError
				if errors.As(err, &ae) && ae.ErrorCode() == "ConditionalRequestConflict" {
					return aws.TrueTernary
				}
				return aws.UnknownTernary
			}),
		}, o.Retryables...)
	})
}

// unreachable reports an error of connecting at all: refused, no route,
// no such host. A connection that drops later is not one.
func unreachable(err error) bool {
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return dns.IsNotFound
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// tlsMisfit says what is wrong when err is a TLS setting that will not
// pass by itself: an https:// endpoint that speaks plain HTTP, or a
// certificate this machine does not trust; "" otherwise.
func tlsMisfit(err error) string {
	var cv *tls.CertificateVerificationError
	var ua x509.UnknownAuthorityError
	var he x509.HostnameError
	switch {
	case strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return "it answers plain HTTP to https:// (write the endpoint as http://…)"
	case errors.As(err, &cv), errors.As(err, &ua), errors.As(err, &he):
		return "its TLS certificate is not one this machine trusts"
	}
	return ""
}

func (c *Client) String() string {
	return "s3://" + c.Bucket + "/" + strings.TrimSuffix(c.Prefix, "/")
}

// Key is the bucket's key of key under the prefix.
func (c *Client) Key(key string) string { return c.Prefix + key }

// Where names key under the prefix as a URL, for messages.
func (c *Client) Where(key string) string { return "s3://" + c.Bucket + "/" + c.Prefix + key }

// Code is what an S3 error answer means to a caller that acts on it.
type Code int

const (
	Precondition Code = iota + 1 // If-Match / If-None-Match failed
	NoUpload                     // no such multipart upload
	NotFound                     // no such key
	BadDigest                    // the body did not match the checksum sent with it
)

// Error is an answer with a Code, from op on Where.
type Error struct {
	Code  Code
	Op    string
	Where string
	Err   error
}

func (e *Error) Error() string { return fmt.Sprintf("%s %s: %v", e.Op, e.Where, e.Err) }
func (e *Error) Unwrap() error { return e.Err }

// CodeOf is err's Code, or 0.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// Classify wraps an SDK error of op on key ("": the bucket and prefix)
// with where it happened and its errkind kind, or as an *Error where the
// answer has a Code.
func (c *Client) Classify(op, key string, err error) error {
	if err == nil {
		return nil
	}
	where := c.Where(key)
	if key == "" {
		where = c.String()
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s %s: %w", op, where, err)
	}
	if unreachable(err) {
		var cause error = err
		var oe *net.OpError
		if errors.As(err, &oe) {
			cause = oe
		}
		if c.opened.Load() {
			return errkind.Errorf(errkind.Retryable, "%s %s: lost the S3 endpoint %s, which answered before: %v", op, where, c.Endpoint, cause)
		}
		return errkind.Errorf(errkind.Usage, "%s %s: cannot reach the S3 endpoint %s (check AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL): %v", op, where, c.Endpoint, cause)
	}
	if why := tlsMisfit(err); why != "" {
		return errkind.Errorf(errkind.Usage, "%s %s: the S3 endpoint %s: %s (check AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL): %v", op, where, c.Endpoint, why, err)
	}
	code, status, msg := "", 0, ""
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code, msg = ae.ErrorCode(), ae.ErrorMessage()
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	coded := func(k Code) error { return &Error{Code: k, Op: op, Where: where, Err: err} }
	switch {
	case code == "PreconditionFailed" || status == http.StatusPreconditionFailed:
		return coded(Precondition)
	case code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch" || code == "AccessDenied" ||
		code == "XAdminUserNotFound" || // versitygw: an access key it does not know
		code == "InvalidToken" || code == "ExpiredToken" || status == http.StatusForbidden || status == http.StatusUnauthorized:
		return errkind.Errorf(errkind.Usage, "%s %s: %s refused the credentials (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE): %s %s", op, where, c.Endpoint, cmpOr(code, http.StatusText(status)), msg)
	case code == "NoSuchBucket":
		return errkind.Errorf(errkind.BadInput, "%s %s: bucket %q does not exist at %s", op, where, c.Bucket, c.Endpoint)
	case code == "InvalidBucketName":
		return errkind.Errorf(errkind.Usage, "%s %s: %s refuses the bucket name %q (S3 bucket names are 3 to 63 lowercase letters, digits, dots and hyphens)", op, where, c.Endpoint, c.Bucket)
	case code == "NoSuchUpload":
		return coded(NoUpload)
	case code == "NoSuchKey" || status == http.StatusNotFound && key != "":
		return coded(NotFound)
	case code == "BadDigest" || code == "XAmzContentSHA256Mismatch" || code == "InvalidDigest":
		return coded(BadDigest)
	case status == http.StatusNotFound && code == "NotFound":
		return errkind.Errorf(errkind.BadInput, "%s %s: bucket %q does not exist at %s", op, where, c.Bucket, c.Endpoint)
	case status == http.StatusNotFound && code == "":
		// A HEAD's answer has no body; a listing's should have an S3
		// error code: a web server that is not S3 answers without one.
		return errkind.Errorf(errkind.BadInput, "%s %s: bucket %q does not exist at %s, or that is not an S3 server (it answered 404 with no S3 error code)", op, where, c.Bucket, c.Endpoint)
	case status >= 500 || status == http.StatusTooManyRequests || code == "SlowDown" || code == "ConditionalRequestConflict":
		return errkind.Errorf(errkind.Retryable, "%s %s: %w", op, where, err)
	case status == 0:
		// No HTTP answer: the connection broke mid-request.
		return errkind.Errorf(errkind.Retryable, "%s %s: %w", op, where, err)
	}
	return fmt.Errorf("%s %s: %w", op, where, err)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Date is the server's clock when it answered: the response's Date.
func Date(md smithymiddleware.Metadata) time.Time {
	if r, ok := awsmiddleware.GetRawResponse(md).(*smithyhttp.Response); ok {
		if t, err := http.ParseTime(r.Header.Get("Date")); err == nil {
			return t
		}
	}
	return time.Time{}
}

// B64 is a checksum as S3 headers carry it.
func B64(sum []byte) *string { return aws.String(base64.StdEncoding.EncodeToString(sum)) }

// Unb64 is a SHA-256 checksum header's value as bytes (ok false when it
// is not one).
func Unb64(s string) (sum [32]byte, ok bool) {
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(raw) != 32 {
		return sum, false
	}
	copy(sum[:], raw)
	return sum, true
}

// GetRange reads len(buf) bytes of the object key (under the prefix) at
// off. A body cut off midway (a dropped connection: the SDK retries
// requests, not the reading of an answer) is asked again for what is
// missing, a few times. classify makes the caller's error of an SDK one
// (c.Classify, or the caller's mapping of it).
func (c *Client) GetRange(ctx context.Context, key string, off int64, buf []byte, classify func(op, key string, err error) error) error {
	_, err := c.GetRangeMatch(ctx, key, "", off, buf, classify)
	return err
}

// GetRangeMatch is GetRange of the object's version whose ETag is etag
// ("": any): every request, the first and those asking again for the rest
// of a cut-off body, carries If-Match, so the bytes are all of that one
// version, or the error is a Precondition one. meta is the object's
// metadata (x-amz-meta-…) as its first answer gave it.
func (c *Client) GetRangeMatch(ctx context.Context, key, etag string, off int64, buf []byte, classify func(op, key string, err error) error) (meta map[string]string, err error) {
	got := 0
	for attempt := 0; got < len(buf); attempt++ {
		start := off + int64(got)
		in := &s3api.GetObjectInput{Bucket: &c.Bucket, Key: aws.String(c.Prefix + key),
			Range: aws.String(fmt.Sprintf("bytes=%d-%d", start, off+int64(len(buf))-1))}
		if etag != "" {
			in.IfMatch = aws.String(etag)
		}
		out, err := c.API.GetObject(ctx, in)
		if err != nil {
			return nil, classify("get", key, err)
		}
		if meta == nil {
			meta = out.Metadata
		}
		if cl := aws.ToInt64(out.ContentLength); cl < int64(len(buf)-got) {
			out.Body.Close()
			return nil, fmt.Errorf("get %s: %d of %d bytes at %d: %w", c.Where(key), got+int(cl), len(buf), off, io.ErrUnexpectedEOF)
		}
		n, err := io.ReadFull(out.Body, buf[got:])
		out.Body.Close()
		got += n
		if err == nil {
			return meta, nil
		}
		if ctx.Err() != nil || attempt >= 5 {
			return nil, classify("get", key, err)
		}
		c.Retried()
		select {
		case <-time.After(time.Duration(100<<attempt) * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return meta, nil
}

// UnsignedPayload, an option of a PutObject or UploadPart that carries
// x-amz-checksum-sha256, leaves the body out of the request's signature:
// the checksum, a signed header, already binds it, and the server checks
// it (the store's probe makes sure of that). Signing the payload too would
// hash every byte once more on each side: on loopback, where CPU is the
// limit, a 200 MB file went at 59 MB/s signed.
func UnsignedPayload(o *s3api.Options) {
	o.APIOptions = append(o.APIOptions, v4.SwapComputePayloadSHA256ForUnsignedPayloadMiddleware)
}
