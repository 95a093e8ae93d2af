// Package s3 is the store's Backend on S3-compatible object storage
// (AWS S3, Cloudflare R2, Backblaze B2, Ceph RGW, MinIO, versitygw …) at
// s3://BUCKET/PREFIX.
//
// The connection (settings read as every S3 tool reads them, explicit
// SHA-256 checksums only) and the classification of errors are
// internal/s3client's, shared with transfer's S3 destination; this
// package maps the answers the store acts on to its sentinels.
package s3

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	smithymiddleware "github.com/aws/smithy-go/middleware"

	"github.com/ferry-llm/ferry/internal/s3client"
	"github.com/ferry-llm/ferry/store"
)

// DefaultRegion is used when no setting names one.
const DefaultRegion = s3client.DefaultRegion

// Backend is a bucket and a key prefix.
type Backend struct {
	c        *s3api.Client
	cl       *s3client.Client
	bucket   string
	prefix   string // "" or ending in "/"
	endpoint string // for messages: the custom endpoint, or "AWS S3"
}

// Retries is how many requests (and cut-off answers) were tried again.
func (b *Backend) Retries() int64 { return b.cl.Retries() }

var _ store.Backend = (*Backend)(nil)

// ParseURL splits "s3://BUCKET[/PREFIX]".
func ParseURL(u string) (bucket, prefix string, err error) { return s3client.ParseURL(u) }

// IsURL reports whether s names an S3 store.
func IsURL(s string) bool { return s3client.IsURL(s) }

// Options tune the connection; the zero value is the default.
type Options = s3client.Options

// DefaultStallTimeout is Options.StallTimeout's default.
const DefaultStallTimeout = s3client.DefaultStallTimeout

// Open connects to the store at url ("s3://BUCKET/PREFIX") with the
// standard settings, and checks that the credentials work and the bucket
// exists: a wrong setting is an error here, not at the first write.
func Open(ctx context.Context, url string) (*Backend, error) { return OpenWith(ctx, url, Options{}) }

// OpenWith is Open with options.
func OpenWith(ctx context.Context, url string, opt Options) (*Backend, error) {
	cl, err := s3client.Open(ctx, url, opt)
	if err != nil {
		return nil, err
	}
	return &Backend{c: cl.API, cl: cl, bucket: cl.Bucket, prefix: cl.Prefix, endpoint: cl.Endpoint}, nil
}

func (b *Backend) String() string { return b.cl.String() }

// OnThisMachine says whether the endpoint is a loopback address
// (localhost, 127.0.0.0/8, ::1): a gateway beside ferry, whose CPU each
// request spends too (store.OnThisMachine). Names are not resolved.
func (b *Backend) OnThisMachine() bool { return loopback(b.endpoint) }

func loopback(endpoint string) bool {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return false
	}
	host := u.Hostname()
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// DateGrain is a second: S3's Date and Last-Modified have whole seconds
// (store.DateGrain).
func (b *Backend) DateGrain() time.Duration { return time.Second }

// Endpoint is the server the backend talks to, for messages.
func (b *Backend) Endpoint() string { return b.endpoint }

// Bucket is the bucket the store is in.
func (b *Backend) Bucket() string { return b.bucket }

// ObjectKey is the bucket's key of the store's object key.
func (b *Backend) ObjectKey(key string) string { return b.prefix + key }

func (b *Backend) where(key string) string { return b.cl.Where(key) }

// classify wraps an SDK error with where it happened, the store's
// sentinel for it and its errkind kind.
func (b *Backend) classify(op, key string, err error) error {
	err = b.cl.Classify(op, key, err)
	var e *s3client.Error
	if !errors.As(err, &e) {
		return err
	}
	switch e.Code {
	case s3client.Precondition:
		return fmt.Errorf("%s %s: %w", e.Op, e.Where, store.ErrPrecondition)
	case s3client.NoUpload:
		return fmt.Errorf("%s %s: %w", e.Op, e.Where, store.ErrNoUpload)
	case s3client.NotFound:
		return fmt.Errorf("%s %s: %w", e.Op, e.Where, store.ErrNotFound)
	case s3client.BadDigest:
		return fmt.Errorf("%s %s: %w (%v)", e.Op, e.Where, store.ErrBadDigest, e.Err)
	}
	return err
}

// date is the server's clock when it answered: the response's Date.
func date(md smithymiddleware.Metadata) time.Time { return s3client.Date(md) }

func b64(sum []byte) *string { return s3client.B64(sum) }

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

// GetRange implements store.Backend (s3client's GetRange: a body cut off
// midway is asked again for what is missing).
func (b *Backend) GetRange(ctx context.Context, key string, off int64, buf []byte) error {
	return b.cl.GetRange(ctx, key, off, buf, b.classify)
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
	}, s3client.UnsignedPayload)
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
		ChecksumSHA256: b64(sum[:]), ChecksumAlgorithm: types.ChecksumAlgorithmSha256}, s3client.UnsignedPayload)
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
