// Package s3 is the store's Backend on S3-compatible object storage
// (AWS S3, Cloudflare R2, Backblaze B2, Ceph RGW, MinIO, versitygw …) at
// s3://BUCKET/PREFIX.
//
// Endpoint, region and credentials are read the way every S3 tool reads
// them (aws-sdk-go-v2's config): AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL,
// AWS_REGION, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE,
// ~/.aws/config and ~/.aws/credentials. A custom endpoint is addressed
// path-style (http://host/bucket/key), which every S3-compatible server
// serves. Checksums are sent only where ferry gives them (SHA-256 on every
// put and part, so the server rejects a body that does not match), never
// the SDK's default CRC32 trailers, which several S3-compatible servers
// refuse.
//
// Errors carry errkind kinds: wrong credentials and an unreachable
// endpoint are usage errors, a missing bucket is bad input, none of them
// retried; throttling, 5xx answers and dropped connections are retried by
// the SDK and then Retryable.
package s3

import (
	"bytes"
	"context"
	"crypto/sha256"
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
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	smithymiddleware "github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/store"
)

// DefaultRegion is used when no setting names one: what S3-compatible
// servers answer for, and AWS's default.
const DefaultRegion = "us-east-1"

// Backend is a bucket and a key prefix.
type Backend struct {
	c        *s3api.Client
	bucket   string
	prefix   string // "" or ending in "/"
	endpoint string // for messages: the custom endpoint, or "AWS"
	retries  atomic.Int64
}

// Retries is how many requests (and cut-off answers) were tried again.
func (b *Backend) Retries() int64 { return b.retries.Load() }

// countingRetryer counts the retries its retryer grants.
type countingRetryer struct {
	aws.Retryer
	n *atomic.Int64
}

func (r countingRetryer) RetryDelay(attempt int, err error) (time.Duration, error) {
	r.n.Add(1)
	return r.Retryer.RetryDelay(attempt, err)
}

var _ store.Backend = (*Backend)(nil)

// ParseURL splits "s3://BUCKET[/PREFIX]".
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
	if prefix != "" {
		prefix += "/"
	}
	return bucket, prefix, nil
}

// IsURL reports whether s names an S3 store.
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

// Open connects to the store at url ("s3://BUCKET/PREFIX") with the
// standard settings, and checks that the credentials work and the bucket
// exists: a wrong setting is an error here, not at the first write.
func Open(ctx context.Context, url string) (*Backend, error) { return OpenWith(ctx, url, Options{}) }

// OpenWith is Open with options.
func OpenWith(ctx context.Context, url string, opt Options) (*Backend, error) {
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
	b := &Backend{bucket: bucket, prefix: prefix, endpoint: "AWS S3"}
	cfg, err := config.LoadDefaultConfig(ctx,
		config.WithHTTPClient(httpClient),
		config.WithRetryer(func() aws.Retryer { return countingRetryer{newRetryer(), &b.retries} }),
		config.WithRequestChecksumCalculation(aws.RequestChecksumCalculationWhenRequired),
		config.WithResponseChecksumValidation(aws.ResponseChecksumValidationWhenRequired),
	)
	if err != nil {
		return nil, errkind.Errorf(errkind.Usage, "%s: S3 settings (AWS_* variables, AWS_PROFILE, ~/.aws/config): %w", url, err)
	}
	if cfg.Region == "" {
		cfg.Region = DefaultRegion
	}
	b.c = s3api.NewFromConfig(cfg, func(o *s3api.Options) {
		if o.BaseEndpoint != nil {
			o.UsePathStyle = true
			b.endpoint = *o.BaseEndpoint
		}
	})
	if _, err := cfg.Credentials.Retrieve(ctx); err != nil {
		return nil, errkind.Errorf(errkind.Usage, "%s: no S3 credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with ~/.aws/credentials): %w", url, err)
	}
	// A listing, not a HEAD: its error answers carry a code (a HEAD's
	// carry only a status, and some servers answer 404 to unknown keys).
	if _, err := b.c.ListObjectsV2(ctx, &s3api.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(prefix), MaxKeys: aws.Int32(1)}); err != nil {
		return nil, b.classify("open", "", err)
	}
	return b, nil
}

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
				if unreachable(err) {
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

func (b *Backend) String() string {
	return "s3://" + b.bucket + "/" + strings.TrimSuffix(b.prefix, "/")
}

// Endpoint is the server the backend talks to, for messages.
func (b *Backend) Endpoint() string { return b.endpoint }

// Bucket is the bucket the store is in.
func (b *Backend) Bucket() string { return b.bucket }

// ObjectKey is the bucket's key of the store's object key.
func (b *Backend) ObjectKey(key string) string { return b.prefix + key }

func (b *Backend) where(key string) string { return "s3://" + b.bucket + "/" + b.prefix + key }

// classify wraps an SDK error with where it happened, the store's
// sentinel for it and its errkind kind.
func (b *Backend) classify(op, key string, err error) error {
	if err == nil {
		return nil
	}
	where := b.where(key)
	if key == "" {
		where = b.String()
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
		return errkind.Errorf(errkind.Usage, "%s %s: cannot reach the S3 endpoint %s (check AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL): %v", op, where, b.endpoint, cause)
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
	switch {
	case code == "PreconditionFailed" || status == http.StatusPreconditionFailed:
		return fmt.Errorf("%s %s: %w", op, where, store.ErrPrecondition)
	case code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch" || code == "AccessDenied" ||
		code == "XAdminUserNotFound" || // versitygw: an access key it does not know
		code == "InvalidToken" || code == "ExpiredToken" || status == http.StatusForbidden || status == http.StatusUnauthorized:
		return errkind.Errorf(errkind.Usage, "%s %s: %s refused the credentials (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE): %s %s", op, where, b.endpoint, cmpOr(code, http.StatusText(status)), msg)
	case code == "NoSuchBucket":
		return errkind.Errorf(errkind.BadInput, "%s %s: bucket %q does not exist at %s", op, where, b.bucket, b.endpoint)
	case code == "NoSuchUpload":
		return fmt.Errorf("%s %s: %w", op, where, store.ErrNoUpload)
	case code == "NoSuchKey" || status == http.StatusNotFound && key != "":
		return fmt.Errorf("%s %s: %w", op, where, store.ErrNotFound)
	case code == "BadDigest" || code == "XAmzContentSHA256Mismatch" || code == "InvalidDigest":
		return fmt.Errorf("%s %s: %w (%v)", op, where, store.ErrBadDigest, err)
	case status == http.StatusNotFound && (code == "" || code == "NotFound"):
		return errkind.Errorf(errkind.BadInput, "%s %s: bucket %q does not exist at %s", op, where, b.bucket, b.endpoint)
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

// date is the server's clock when it answered: the response's Date.
func date(md smithymiddleware.Metadata) time.Time {
	if r, ok := awsmiddleware.GetRawResponse(md).(*smithyhttp.Response); ok {
		if t, err := http.ParseTime(r.Header.Get("Date")); err == nil {
			return t
		}
	}
	return time.Time{}
}

func b64(sum []byte) *string { return aws.String(base64.StdEncoding.EncodeToString(sum)) }

// Head implements store.Backend.
func (b *Backend) Head(ctx context.Context, key string) (store.Info, error) {
	out, err := b.c.HeadObject(ctx, &s3api.HeadObjectInput{Bucket: &b.bucket, Key: aws.String(b.prefix + key)})
	if err != nil {
		return store.Info{}, b.classify("head", key, err)
	}
	return store.Info{Key: key, Size: aws.ToInt64(out.ContentLength), ETag: aws.ToString(out.ETag),
		Modified: aws.ToTime(out.LastModified), Date: date(out.ResultMetadata)}, nil
}

// Get implements store.Backend.
func (b *Backend) Get(ctx context.Context, key string, max int64) ([]byte, store.Info, error) {
	out, err := b.c.GetObject(ctx, &s3api.GetObjectInput{Bucket: &b.bucket, Key: aws.String(b.prefix + key)})
	if err != nil {
		return nil, store.Info{}, b.classify("get", key, err)
	}
	defer out.Body.Close()
	if n := aws.ToInt64(out.ContentLength); n > max {
		return nil, store.Info{}, fmt.Errorf("%s: %w: %d bytes, limit %d", b.where(key), store.ErrTooLarge, n, max)
	}
	body, err := io.ReadAll(io.LimitReader(out.Body, max+1))
	if err != nil {
		return nil, store.Info{}, b.classify("get", key, err)
	}
	if int64(len(body)) > max {
		return nil, store.Info{}, fmt.Errorf("%s: %w: over %d bytes", b.where(key), store.ErrTooLarge, max)
	}
	return body, store.Info{Key: key, Size: int64(len(body)), ETag: aws.ToString(out.ETag),
		Modified: aws.ToTime(out.LastModified), Date: date(out.ResultMetadata)}, nil
}

// GetRange implements store.Backend. A body cut off midway (a dropped
// connection: the SDK retries requests, not the reading of an answer) is
// asked again for what is missing, a few times.
func (b *Backend) GetRange(ctx context.Context, key string, off int64, buf []byte) error {
	got := 0
	for attempt := 0; got < len(buf); attempt++ {
		start := off + int64(got)
		out, err := b.c.GetObject(ctx, &s3api.GetObjectInput{Bucket: &b.bucket, Key: aws.String(b.prefix + key),
			Range: aws.String(fmt.Sprintf("bytes=%d-%d", start, off+int64(len(buf))-1))})
		if err != nil {
			return b.classify("get", key, err)
		}
		if cl := aws.ToInt64(out.ContentLength); cl < int64(len(buf)-got) {
			out.Body.Close()
			return fmt.Errorf("get %s: %d of %d bytes at %d: %w", b.where(key), got+int(cl), len(buf), off, io.ErrUnexpectedEOF)
		}
		n, err := io.ReadFull(out.Body, buf[got:])
		out.Body.Close()
		got += n
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || attempt >= 5 {
			return b.classify("get", key, err)
		}
		b.retries.Add(1)
		select {
		case <-time.After(time.Duration(100<<attempt) * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func conditions(opt store.PutOptions) (ifNoneMatch, ifMatch *string) {
	if opt.IfNoneMatch {
		ifNoneMatch = aws.String("*")
	}
	if opt.IfMatch != "" {
		ifMatch = aws.String(opt.IfMatch)
	}
	return
}

// Put implements store.Backend.
func (b *Backend) Put(ctx context.Context, key string, body []byte, opt store.PutOptions) (store.Info, error) {
	sum := opt.SHA256
	if sum == nil {
		s := sha256Sum(body)
		sum = &s
	}
	inm, im := conditions(opt)
	out, err := b.c.PutObject(ctx, &s3api.PutObjectInput{
		Bucket: &b.bucket, Key: aws.String(b.prefix + key),
		Body: bytes.NewReader(body), ContentLength: aws.Int64(int64(len(body))),
		ChecksumSHA256: b64(sum[:]), IfNoneMatch: inm, IfMatch: im,
	})
	if err != nil {
		return store.Info{}, b.classify("put", key, err)
	}
	d := date(out.ResultMetadata)
	return store.Info{Key: key, Size: int64(len(body)), ETag: aws.ToString(out.ETag), Modified: d, Date: d}, nil
}

// Delete implements store.Backend.
func (b *Backend) Delete(ctx context.Context, key, ifMatch string) error {
	in := &s3api.DeleteObjectInput{Bucket: &b.bucket, Key: aws.String(b.prefix + key)}
	if ifMatch != "" {
		in.IfMatch = aws.String(ifMatch)
	}
	_, err := b.c.DeleteObject(ctx, in)
	return b.classify("delete", key, err)
}

// List implements store.Backend.
func (b *Backend) List(ctx context.Context, prefix string, fn func(store.Info) error) error {
	p := s3api.NewListObjectsV2Paginator(b.c, &s3api.ListObjectsV2Input{Bucket: &b.bucket, Prefix: aws.String(b.prefix + prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return b.classify("list", prefix, err)
		}
		d := date(page.ResultMetadata)
		for _, o := range page.Contents {
			k := strings.TrimPrefix(aws.ToString(o.Key), b.prefix)
			if err := fn(store.Info{Key: k, Size: aws.ToInt64(o.Size), ETag: aws.ToString(o.ETag), Modified: aws.ToTime(o.LastModified), Date: d}); err != nil {
				return err
			}
		}
	}
	return nil
}

// CreateUpload implements store.Backend.
func (b *Backend) CreateUpload(ctx context.Context, key string) (string, error) {
	out, err := b.c.CreateMultipartUpload(ctx, &s3api.CreateMultipartUploadInput{Bucket: &b.bucket, Key: aws.String(b.prefix + key),
		ChecksumAlgorithm: types.ChecksumAlgorithmSha256})
	if err != nil {
		return "", b.classify("create upload", key, err)
	}
	return aws.ToString(out.UploadId), nil
}

// UploadPart implements store.Backend.
func (b *Backend) UploadPart(ctx context.Context, key, id string, n int, body []byte, sum [32]byte) (store.Part, error) {
	out, err := b.c.UploadPart(ctx, &s3api.UploadPartInput{Bucket: &b.bucket, Key: aws.String(b.prefix + key),
		UploadId: aws.String(id), PartNumber: aws.Int32(int32(n)),
		Body: bytes.NewReader(body), ContentLength: aws.Int64(int64(len(body))),
		ChecksumSHA256: b64(sum[:]), ChecksumAlgorithm: types.ChecksumAlgorithmSha256})
	if err != nil {
		return store.Part{}, b.classify(fmt.Sprintf("upload part %d of", n), key, err)
	}
	return store.Part{Number: n, Size: int64(len(body)), SHA256: sum, ETag: aws.ToString(out.ETag)}, nil
}

// ListParts implements store.Backend. A part the server lists without a
// SHA-256 is left out: it cannot be trusted to be the bytes ferry sent.
func (b *Backend) ListParts(ctx context.Context, key, id string) ([]store.Part, error) {
	var parts []store.Part
	p := s3api.NewListPartsPaginator(b.c, &s3api.ListPartsInput{Bucket: &b.bucket, Key: aws.String(b.prefix + key), UploadId: aws.String(id)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, b.classify("list parts of", key, err)
		}
		for _, pt := range page.Parts {
			raw, err := base64.StdEncoding.DecodeString(aws.ToString(pt.ChecksumSHA256))
			if err != nil || len(raw) != 32 {
				continue
			}
			part := store.Part{Number: int(aws.ToInt32(pt.PartNumber)), Size: aws.ToInt64(pt.Size), ETag: aws.ToString(pt.ETag)}
			copy(part.SHA256[:], raw)
			parts = append(parts, part)
		}
	}
	return parts, nil
}

// CompleteUpload implements store.Backend.
func (b *Backend) CompleteUpload(ctx context.Context, key, id string, parts []store.Part, opt store.PutOptions) (store.Info, error) {
	cps := make([]types.CompletedPart, len(parts))
	for i, p := range parts {
		cps[i] = types.CompletedPart{PartNumber: aws.Int32(int32(p.Number)), ETag: aws.String(p.ETag), ChecksumSHA256: b64(p.SHA256[:])}
	}
	inm, im := conditions(opt)
	out, err := b.c.CompleteMultipartUpload(ctx, &s3api.CompleteMultipartUploadInput{Bucket: &b.bucket, Key: aws.String(b.prefix + key),
		UploadId: aws.String(id), MultipartUpload: &types.CompletedMultipartUpload{Parts: cps}, IfNoneMatch: inm, IfMatch: im})
	if err != nil {
		return store.Info{}, b.classify("complete upload of", key, err)
	}
	var size int64
	for _, p := range parts {
		size += p.Size
	}
	d := date(out.ResultMetadata)
	return store.Info{Key: key, Size: size, ETag: aws.ToString(out.ETag), Modified: d, Date: d}, nil
}

// AbortUpload implements store.Backend.
func (b *Backend) AbortUpload(ctx context.Context, key, id string) error {
	_, err := b.c.AbortMultipartUpload(ctx, &s3api.AbortMultipartUploadInput{Bucket: &b.bucket, Key: aws.String(b.prefix + key), UploadId: aws.String(id)})
	return b.classify("abort upload of", key, err)
}

// ListUploads implements store.Backend.
func (b *Backend) ListUploads(ctx context.Context, prefix string, fn func(store.Upload) error) error {
	in := &s3api.ListMultipartUploadsInput{Bucket: &b.bucket, Prefix: aws.String(b.prefix + prefix)}
	for {
		out, err := b.c.ListMultipartUploads(ctx, in)
		if err != nil {
			return b.classify("list uploads", prefix, err)
		}
		for _, u := range out.Uploads {
			k := strings.TrimPrefix(aws.ToString(u.Key), b.prefix)
			if err := fn(store.Upload{Key: k, ID: aws.ToString(u.UploadId), Initiated: aws.ToTime(u.Initiated)}); err != nil {
				return err
			}
		}
		if !aws.ToBool(out.IsTruncated) {
			return nil
		}
		in.KeyMarker, in.UploadIdMarker = out.NextKeyMarker, out.NextUploadIdMarker
	}
}

func sha256Sum(b []byte) [32]byte { return sha256.Sum256(b) }
