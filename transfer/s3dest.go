package transfer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"golang.org/x/sync/errgroup"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/progress"
	"github.com/ferry-llm/ferry/internal/s3client"
)

// s3Dest is a prefix in an S3 bucket (s3://BUCKET/PREFIX): file REL is
// the object PREFIX/REL. Nothing half-written is ever visible under an
// object's key:
//
//   - a file of one chunk is one PutObject carrying the body's SHA-256
//     (x-amz-checksum-sha256): the server stores it whole or, when the
//     body it got does not match, not at all (BadDigest);
//   - a larger file is a multipart upload whose parts are the chunks,
//     each UploadPart carrying its chunk's SHA-256 (rejected the same
//     way). The upload's ID is kept in a file of this endpoint's own in
//     the state directory; on resume ListParts says which parts the
//     server holds and their checksums, which are the chunk digests the
//     core compares with what it read. The object appears only at
//     CompleteMultipartUpload, made once every part was so verified.
//
// The "partial" of the core is the upload under way; its chunks are
// checked against ListParts (the server's SHA-256 of each part it holds):
// S3 has no other way to read an incomplete upload back. Every object
// carries the whole file's sha256 in its metadata (x-amz-meta-ferry-sha256,
// given at PutObject or CreateMultipartUpload): the listing (one
// ListObjectsV2 request per 1000 keys) says what is there, that metadata
// (one HEAD) whether it is the file, and with Verify its bytes are hashed
// again by ranged GETs. S3 has no links: a link of the plan becomes a
// server-side copy of the file it points to (no byte sent again), marked
// with the link's target (x-amz-meta-ferry-link).
type s3Dest struct {
	d      Destination
	o      *Options
	bucket string
	prefix string
	cs     int64 // the plan's chunk size: a file's part n is its chunk n-1
	byRel  map[string]*File

	omu     sync.Mutex
	c       *s3client.Client
	openErr error

	requests atomic.Int64

	mu        sync.Mutex
	ups       map[string]*s3Upload // multipart uploads under way, by rel
	others    map[string]*s3Upload // those of files other plans send, kept
	puts      map[string]s3Put     // small files put this run, by rel
	committed map[string]string    // small files committed this run: their ETags
	roots     []string             // what list listed
	statePath string
}

// s3Upload is one multipart upload, as the state file keeps it.
type s3Upload struct {
	ID   string `json:"id"`
	Size int64  `json:"size"`

	pmu   sync.Mutex
	parts map[int]s3Part // by part number: what the server said it holds
}

type s3Part struct {
	size int64
	sum  [32]byte
	etag string
}

// s3Put is a small file's object as the server took it.
type s3Put struct {
	sum  [32]byte
	date time.Time
	etag string
}

// S3 limits on multipart uploads.
const (
	s3MinPart  = 5 << 20
	s3MaxParts = 10000
	s3MaxPut   = 5 << 30
)

// s3Verifier is what reports call the S3 destination's check.
const s3Verifier = "x-amz-checksum-sha256"

// The object metadata (x-amz-meta-…) ferry writes.
const (
	s3MetaSHA256 = "ferry-sha256"
	s3MetaLink   = "ferry-link"
)

func newS3Dest(d Destination, o *Options, p *Plan) *s3Dest {
	s := &s3Dest{d: d, o: o, cs: p.ChunkSize, byRel: map[string]*File{}, ups: map[string]*s3Upload{}, others: map[string]*s3Upload{}, puts: map[string]s3Put{}, committed: map[string]string{}}
	s.bucket, s.prefix, s.openErr = s3client.ParseURL(d.Dir)
	for i := range p.Files {
		s.byRel[p.Files[i].Rel] = &p.Files[i]
	}
	s.statePath = strings.TrimSuffix(JournalPath(o.StateDir, d.Name), ".journal") + ".s3uploads"
	return s
}

func (s *s3Dest) where() string            { return s.d.Name }
func (s *s3Dest) remote(rel string) string { return "s3://" + s.bucket + "/" + s.prefix + rel }
func (s *s3Dest) counts() (int64, int64)   { return s.requests.Load(), 0 }
func (s *s3Dest) slotOf(k int) int         { return k }
func (s *s3Dest) metaSlot(k int) int       { return k }
func (s *s3Dest) closeAll()                {}
func (s *s3Dest) closePartial(string)      {}
func (s *s3Dest) flush(context.Context) error {
	return nil // an object is durable when the server answers its put
}

func (s *s3Dest) watch(ctx context.Context, stop <-chan struct{}) {
	select {
	case <-stop:
	case <-ctx.Done():
	}
}

// client connects once (checking the credentials and the bucket).
func (s *s3Dest) client(ctx context.Context) (*s3client.Client, error) {
	s.omu.Lock()
	defer s.omu.Unlock()
	if s.c == nil && s.openErr == nil {
		s.requests.Add(1)
		s.c, s.openErr = s3client.Open(ctx, s.d.Dir, s3client.Options{StallTimeout: s.o.StallTimeout})
	}
	return s.c, s.openErr
}

// api is the connected client; callers run after list, which connected.
func (s *s3Dest) api() *s3api.Client {
	s.requests.Add(1)
	return s.c.API
}

// classify names an S3 error's destination object and kind; a body the
// server rejected for its checksum is a verification failure.
func (s *s3Dest) classify(op, rel string, err error) error {
	err = s.c.Classify(op, rel, err)
	if s3client.CodeOf(err) == s3client.BadDigest {
		return fmt.Errorf("%w: %s rejected the body sent as not matching its SHA-256: %v", ErrVerify, s.c.Endpoint, err)
	}
	return err
}

func (s *s3Dest) probeTools(context.Context) (*remoteTools, error) {
	return &remoteTools{hashCmd: s3Verifier, label: s3Verifier, ranges: true, syncfs: true}, nil
}

// checkPlan refuses a chunk size S3's multipart rules cannot take for a
// file of the plan.
func (s *s3Dest) checkPlan(cs int64) error {
	for _, f := range s.byRel {
		switch {
		case f.Size <= cs && f.Size > s3MaxPut:
			return errkind.Errorf(errkind.Usage, "%s is %d bytes, one chunk of %d, over S3's 5 GiB limit for one put: give a chunk size of at most 5GiB", f.Rel, f.Size, cs)
		case f.Size > cs && cs < s3MinPart:
			return errkind.Errorf(errkind.Usage, "chunk size %d is under S3's 5 MiB minimum part size, and %s (%d bytes) is sent in parts: give --chunk-size 5MiB or more", cs, f.Rel, f.Size)
		case f.Chunks(cs) > s3MaxParts:
			return errkind.Errorf(errkind.Usage, "%s would be %d parts of %d bytes, over S3's 10000: give a larger --chunk-size", f.Rel, f.Chunks(cs), cs)
		}
	}
	return nil
}

// list lists the objects under the roots, and the uploads an earlier run
// left (as REL.partial, of the size the upload was begun for).
func (s *s3Dest) list(ctx context.Context, roots, dirs []string, probe bool) (map[string]entry, bool, error) {
	_, err := s.client(ctx)
	if err != nil {
		return nil, false, err
	}
	if err := s.checkPlan(s.cs); err != nil {
		return nil, false, err
	}
	m := map[string]entry{}
	if err := s.loadState(ctx, m); err != nil {
		return nil, false, err
	}
	s.roots = roots
	err = s.listRoots(ctx, roots, func(rel string, o types.Object) {
		m[rel] = entry{kind: 'f', size: aws.ToInt64(o.Size), alloc: -1, mtime: aws.ToTime(o.LastModified).Unix()}
	})
	if err != nil {
		return nil, false, err
	}
	return m, false, nil
}

// listRoots calls fn with each object under the roots (ListObjectsV2:
// one request per 1000 keys).
func (s *s3Dest) listRoots(ctx context.Context, roots []string, fn func(rel string, o types.Object)) error {
	for _, r := range roots {
		if strings.HasSuffix(r, ".partial") {
			continue // uploads under way are not objects: loadState listed them
		}
		p := s3api.NewListObjectsV2Paginator(s.c.API, &s3api.ListObjectsV2Input{Bucket: &s.bucket, Prefix: aws.String(s.c.Key(r))})
		for p.HasMorePages() {
			s.requests.Add(1)
			page, err := p.NextPage(ctx)
			if err != nil {
				return s.classify("listing", r, err)
			}
			for _, o := range page.Contents {
				rel := strings.TrimPrefix(aws.ToString(o.Key), s.c.Prefix)
				if (rel != r && !strings.HasPrefix(rel, r+"/")) || strings.HasSuffix(rel, "/") {
					continue
				}
				fn(rel, o)
			}
		}
	}
	return nil
}

// restamp lists again, once at the end of a run that put small files, the
// Last-Modified of each object still holding the ETag its put answered
// (a put's answer carries none): the next run's listing then shows what
// the record holds, and the files are trusted without a HEAD each.
func (s *s3Dest) restamp(ctx context.Context) map[string]int64 {
	s.mu.Lock()
	done := maps.Clone(s.committed)
	s.mu.Unlock()
	if len(done) == 0 || s.c == nil {
		return nil
	}
	out := map[string]int64{}
	err := s.listRoots(ctx, s.roots, func(rel string, o types.Object) {
		if etag, ok := done[rel]; ok && etag != "" && etag == aws.ToString(o.ETag) {
			out[rel] = aws.ToTime(o.LastModified).Unix()
		}
	})
	if err != nil {
		s.o.Log.Debug("transfer: relisting for mtimes", "dest", s.d.Name, "err", err)
	}
	return out
}

// loadState reads the uploads an earlier run left, keeps those the server
// still has (ListParts: which parts it holds, and their SHA-256) and lists
// them in m as REL.partial.
func (s *s3Dest) loadState(ctx context.Context, m map[string]entry) error {
	b, err := os.ReadFile(s.statePath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var saved map[string]*s3Upload
	if err := json.Unmarshal(b, &saved); err != nil {
		s.o.Log.Warn("transfer: the record of S3 uploads under way is unreadable; starting them again", "file", s.statePath, "err", err)
		return nil
	}
	for rel, u := range saved {
		f := s.byRel[rel]
		switch {
		case f == nil: // another plan's, kept for its resume
			s.others[rel] = u
			continue
		case f.Size != u.Size: // begun for other bytes of the file
			s.abort(ctx, rel, u)
			continue
		}
		if err := s.listParts(ctx, rel, u); err != nil {
			if s3client.CodeOf(err) == s3client.NoUpload {
				continue
			}
			return err
		}
		s.ups[rel] = u
		m[rel+".partial"] = entry{kind: 'f', size: u.Size, alloc: -1}
	}
	return s.saveState()
}

// saveState writes the uploads under way (removing the file when none
// is), durably: an upload not recorded is one a resume cannot find.
func (s *s3Dest) saveState() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	all := maps.Clone(s.others)
	maps.Copy(all, s.ups)
	if len(all) == 0 {
		if err := os.Remove(s.statePath); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	b, err := json.Marshal(all)
	if err != nil {
		return err
	}
	tmp := s.statePath + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, s.statePath)
	}
	if err == nil {
		err = fsutil.SyncDir(filepath.Dir(s.statePath))
	}
	return err
}

func (s *s3Dest) upload(rel string) *s3Upload {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ups[rel]
}

// listParts learns from the server the parts of u it holds.
func (s *s3Dest) listParts(ctx context.Context, rel string, u *s3Upload) error {
	parts := map[int]s3Part{}
	p := s3api.NewListPartsPaginator(s.c.API, &s3api.ListPartsInput{Bucket: &s.bucket, Key: aws.String(s.c.Key(rel)), UploadId: aws.String(u.ID)})
	for p.HasMorePages() {
		s.requests.Add(1)
		page, err := p.NextPage(ctx)
		if err != nil {
			return s.classify("listing the parts of", rel, err)
		}
		for _, pt := range page.Parts {
			sum, ok := s3client.Unb64(aws.ToString(pt.ChecksumSHA256))
			if !ok {
				continue // no SHA-256: not a part ferry can trust
			}
			parts[int(aws.ToInt32(pt.PartNumber))] = s3Part{size: aws.ToInt64(pt.Size), sum: sum, etag: aws.ToString(pt.ETag)}
		}
	}
	u.pmu.Lock()
	u.parts = parts
	u.pmu.Unlock()
	return nil
}

func (s *s3Dest) abort(ctx context.Context, rel string, u *s3Upload) {
	s.requests.Add(1)
	if _, err := s.c.API.AbortMultipartUpload(ctx, &s3api.AbortMultipartUploadInput{Bucket: &s.bucket, Key: aws.String(s.c.Key(rel)), UploadId: aws.String(u.ID)}); err != nil {
		s.o.Log.Debug("transfer: abort of an earlier upload", "dest", s.d.Name, "file", rel, "err", err)
	}
}

func (s *s3Dest) mkdirs(context.Context, []string, map[string]entry, bool) error { return nil }

func (s *s3Dest) space(context.Context) (int64, bool, error) { return 0, false, nil }

// s3WriteHook, set by tests only, may change the body sent after its
// checksum was computed (a link or a server that garbles what it gets).
var s3WriteHook func(rel string, off int64, data []byte) []byte

func metaOf(f *File) map[string]string {
	if f == nil {
		return nil
	}
	return map[string]string{s3MetaSHA256: f.Digest.Hex()}
}

// putSmall puts a small file as one object, its SHA-256 with it. A body
// the server rejects (it got other bytes than were hashed) is sent again
// twice, then a verification failure.
func (s *s3Dest) putSmall(ctx context.Context, slot int, rel string, data []byte, sync bool, prog progress.Reporter) error {
	sum, err := sumOf(s.byRel[rel].Digest)
	if err != nil {
		return err
	}
	body := data
	if s3WriteHook != nil {
		body = s3WriteHook(rel, 0, data)
	}
	var date time.Time
	var etag string
	took, err := s.sendChecked("put", rel, sum, func() (*string, error) {
		out, err := s.api().PutObject(ctx, &s3api.PutObjectInput{Bucket: &s.bucket, Key: aws.String(s.c.Key(rel)),
			Body: bytes.NewReader(body), ContentLength: aws.Int64(int64(len(body))),
			ChecksumSHA256: s3client.B64(sum[:]), Metadata: metaOf(s.byRel[rel])}, s3client.UnsignedPayload)
		if err != nil {
			return nil, err
		}
		date, etag = s3client.Date(out.ResultMetadata), aws.ToString(out.ETag)
		return out.ChecksumSHA256, nil
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.puts[rel] = s3Put{sum: took, date: date, etag: etag}
	s.mu.Unlock()
	if prog != nil {
		prog.Add(int64(len(data)))
	}
	return nil
}

// createPartial begins rel's multipart upload and records its ID before a
// part is sent. The uploads of rel's key already there are aborted first:
// one an earlier run recorded and does not resume, or one it began and was
// killed before recording (invisible, but stored and billed until aborted).
func (s *s3Dest) createPartial(ctx context.Context, slot int, rel string, size int64) error {
	if f := s.byRel[rel]; f != nil && f.digestLater {
		// Its metadata is given when the upload begins, before a byte is read.
		return errkind.Errorf(errkind.NotBuilt, "%s: its sha256 is not known before it is read (the object has no x-amz-meta-%s), and an S3 destination records it when the upload begins: not built yet; copy it to a local directory first", f.Path, s3MetaSHA256)
	}
	key := s.c.Key(rel)
	in := &s3api.ListMultipartUploadsInput{Bucket: &s.bucket, Prefix: aws.String(key)}
	for {
		out, err := s.api().ListMultipartUploads(ctx, in)
		if err != nil {
			return s.classify("listing the uploads of", rel, err)
		}
		for _, u := range out.Uploads {
			if aws.ToString(u.Key) == key {
				s.abort(ctx, rel, &s3Upload{ID: aws.ToString(u.UploadId)})
			}
		}
		if !aws.ToBool(out.IsTruncated) {
			break
		}
		in.KeyMarker, in.UploadIdMarker = out.NextKeyMarker, out.NextUploadIdMarker
	}
	out, err := s.api().CreateMultipartUpload(ctx, &s3api.CreateMultipartUploadInput{Bucket: &s.bucket, Key: aws.String(s.c.Key(rel)),
		ChecksumAlgorithm: types.ChecksumAlgorithmSha256, Metadata: metaOf(s.byRel[rel])})
	if err != nil {
		return s.classify("beginning the upload of", rel, err)
	}
	s.mu.Lock()
	s.ups[rel] = &s3Upload{ID: aws.ToString(out.UploadId), Size: size, parts: map[int]s3Part{}}
	s.mu.Unlock()
	return s.saveState()
}

func (s *s3Dest) writeChunk(ctx context.Context, slot int, rel string, off int64, data []byte, sum func() digest.Digest, prog progress.Reporter) error {
	if err := s.rewriteChunk(ctx, slot, rel, off, data, sum); err != nil {
		return err
	}
	if prog != nil {
		prog.Add(int64(len(data)))
	}
	return nil
}

// rewriteChunk uploads the chunk at off as its part, its SHA-256 with it
// (a rejected body is sent again twice, then a verification failure).
func (s *s3Dest) rewriteChunk(ctx context.Context, slot int, rel string, off int64, data []byte, chunkSum func() digest.Digest) error {
	u := s.upload(rel)
	if u == nil {
		return fmt.Errorf("%s: no upload under way", s.remote(rel))
	}
	n := int(off/s.cs) + 1
	sum, err := sumOf(chunkSum())
	if err != nil {
		return err
	}
	body := data
	if s3WriteHook != nil {
		body = s3WriteHook(rel, off, data)
	}
	var etag string
	took, err := s.sendChecked(fmt.Sprintf("upload of part %d (offset %d) of", n, off), rel, sum, func() (*string, error) {
		out, err := s.api().UploadPart(ctx, &s3api.UploadPartInput{Bucket: &s.bucket, Key: aws.String(s.c.Key(rel)),
			UploadId: aws.String(u.ID), PartNumber: aws.Int32(int32(n)),
			Body: bytes.NewReader(body), ContentLength: aws.Int64(int64(len(body))),
			ChecksumSHA256: s3client.B64(sum[:]), ChecksumAlgorithm: types.ChecksumAlgorithmSha256}, s3client.UnsignedPayload)
		if err != nil {
			return nil, err
		}
		etag = aws.ToString(out.ETag)
		return out.ChecksumSHA256, nil
	})
	if err != nil {
		return err
	}
	u.pmu.Lock()
	u.parts[n] = s3Part{size: int64(len(data)), sum: took, etag: etag}
	u.pmu.Unlock()
	return nil
}

// sumOf is a digest's bytes.
func sumOf(d digest.Digest) ([32]byte, error) {
	var sum [32]byte
	b, err := hex.DecodeString(d.Hex())
	if err != nil || len(b) != 32 {
		return sum, fmt.Errorf("not a sha256 digest: %q", d)
	}
	copy(sum[:], b)
	return sum, nil
}

// sendChecked sends a body whose SHA-256 is sum by call, which returns the
// checksum the server answered; a body the server refuses as not matching
// (it got other bytes than were hashed) is sent again twice, then is a
// verification failure. It returns the SHA-256 the server holds.
func (s *s3Dest) sendChecked(op, rel string, sum [32]byte, call func() (*string, error)) ([32]byte, error) {
	for attempt := 0; ; attempt++ {
		got, err := call()
		if err != nil {
			err = s.classify(op, rel, err)
			if errors.Is(err, ErrVerify) && attempt < 2 {
				continue
			}
			return sum, err
		}
		if took, ok := s3client.Unb64(aws.ToString(got)); ok {
			return took, nil
		}
		return sum, nil
	}
}

// rangeHash is chunk i's SHA-256 as the server holds it: the part's
// checksum from its upload's answer, or ListParts on resume; "" for a
// part it does not hold or of the wrong size.
func (s *s3Dest) rangeHash(ctx context.Context, conn int, t *remoteTools, rel string, cs int64, i int, retry bool) (digest.Digest, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	base := strings.TrimSuffix(rel, ".partial")
	u := s.upload(base)
	if u == nil {
		return "", fmt.Errorf("%s: no upload under way", s.remote(base))
	}
	u.pmu.Lock()
	p, ok := u.parts[i+1]
	u.pmu.Unlock()
	if !ok || p.size != min(cs, u.Size-int64(i)*cs) {
		return "", nil
	}
	return digest.New(p.sum[:]), nil
}

// readBackChunk asks the server again (ListParts) for the part of chunk
// i: an upload under way cannot be read back any other way.
func (s *s3Dest) readBackChunk(ctx context.Context, slot int, rel string, size, cs int64, i int) (digest.Digest, error) {
	u := s.upload(rel)
	if u == nil {
		return "", fmt.Errorf("%s: no upload under way", s.remote(rel))
	}
	if err := s.listParts(ctx, rel, u); err != nil {
		return "", err
	}
	return s.rangeHash(ctx, 0, nil, rel, cs, i, true)
}

// hashFiles says what the objects rels are: a small file put this run
// (REL.partial) is what the server took against its checksum; an object
// already there is the sha256 its metadata records, or with Verify the
// hash of its bytes read again by ranged GETs. mtimes are the objects'
// Last-Modified (a put's Date).
func (s *s3Dest) hashFiles(ctx context.Context, conn int, t *remoteTools, rels []string, n int64) ([]digest.Digest, []int64, error) {
	ds := make([]digest.Digest, len(rels))
	ts := make([]int64, len(rels))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i, rel := range rels {
		g.Go(func() error {
			base, partial := strings.CutSuffix(rel, ".partial")
			if partial {
				s.mu.Lock()
				p, ok := s.puts[base]
				s.mu.Unlock()
				if ok {
					ds[i], ts[i] = digest.New(p.sum[:]), p.date.Unix()
					return nil
				}
			}
			if s.o.Verify {
				d, _, mt, err := s.read(gctx, base, s.cs)
				ds[i], ts[i] = d, mt
				return err
			}
			s.requests.Add(1)
			out, err := s.c.API.HeadObject(gctx, &s3api.HeadObjectInput{Bucket: &s.bucket, Key: aws.String(s.c.Key(base))})
			if err != nil {
				return s.classify("head", base, err)
			}
			ts[i] = aws.ToTime(out.LastModified).Unix()
			if d, err := digest.FromHex(out.Metadata[s3MetaSHA256]); err == nil {
				ds[i] = d
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, nil, err
	}
	return ds, ts, nil
}

// read hashes the object rel by ranged GETs of cs bytes: its sha256, each
// chunk's, and its Last-Modified.
func (s *s3Dest) read(ctx context.Context, rel string, cs int64) (digest.Digest, []digest.Digest, int64, error) {
	s.requests.Add(1)
	h, err := s.c.API.HeadObject(ctx, &s3api.HeadObjectInput{Bucket: &s.bucket, Key: aws.String(s.c.Key(rel))})
	if err != nil {
		return "", nil, 0, s.classify("head", rel, err)
	}
	size := aws.ToInt64(h.ContentLength)
	whole := sha256.New()
	var chunks []digest.Digest
	buf := make([]byte, min(cs, max(size, 1)))
	for off := int64(0); off < size; off += cs {
		b := buf[:min(cs, size-off)]
		s.requests.Add(1)
		if err := s.c.GetRange(ctx, rel, off, b, s.classify); err != nil {
			return "", nil, 0, err
		}
		whole.Write(b)
		c := sha256.Sum256(b)
		chunks = append(chunks, digest.New(c[:]))
	}
	return digest.New(whole.Sum(nil)), chunks, aws.ToTime(h.LastModified).Unix(), nil
}

// readBack hashes the object of p (REL or REL.partial: a small file's
// object is in place once put) by ranged GETs.
func (s *s3Dest) readBack(ctx context.Context, slot int, p string, size, cs int64) (digest.Digest, []digest.Digest, error) {
	d, chunks, _, err := s.read(ctx, strings.TrimSuffix(p, ".partial"), cs)
	return d, chunks, err
}

// commit: a small file's object is in place since its put; a larger
// file's upload is completed with every part (each verified by the core
// against the digests of what was read) and their checksums, and the
// object appears.
func (s *s3Dest) commit(ctx context.Context, slot int, rel string, perm fs.FileMode, modeSet, stat bool) (int64, error) {
	u := s.upload(rel)
	if u == nil {
		s.mu.Lock()
		p, ok := s.puts[rel]
		delete(s.puts, rel)
		if ok {
			s.committed[rel] = p.etag
		}
		s.mu.Unlock()
		if !ok {
			return 0, fmt.Errorf("%s: nothing was put", s.remote(rel))
		}
		return p.date.Unix(), nil // the answer's Date; restamp learns Last-Modified
	}
	if err := s.listParts(ctx, rel, u); err != nil {
		return 0, err
	}
	n := int((u.Size + s.cs - 1) / s.cs)
	u.pmu.Lock()
	cps := make([]types.CompletedPart, 0, n)
	for k := 1; k <= n; k++ {
		p, ok := u.parts[k]
		if !ok {
			u.pmu.Unlock()
			return 0, fmt.Errorf("%w: %s: the server lists no part %d of the upload", ErrVerify, s.remote(rel), k)
		}
		cps = append(cps, types.CompletedPart{PartNumber: aws.Int32(int32(k)), ETag: aws.String(p.etag), ChecksumSHA256: s3client.B64(p.sum[:])})
	}
	u.pmu.Unlock()
	if _, err := s.api().CompleteMultipartUpload(ctx, &s3api.CompleteMultipartUploadInput{Bucket: &s.bucket, Key: aws.String(s.c.Key(rel)),
		UploadId: aws.String(u.ID), MultipartUpload: &types.CompletedMultipartUpload{Parts: cps}}); err != nil {
		return 0, s.classify("completing the upload of", rel, err)
	}
	s.mu.Lock()
	delete(s.ups, rel)
	s.mu.Unlock()
	if err := s.saveState(); err != nil {
		return 0, err
	}
	out, err := s.api().HeadObject(ctx, &s3api.HeadObjectInput{Bucket: &s.bucket, Key: aws.String(s.c.Key(rel))})
	if err != nil {
		return 0, s.classify("head", rel, err)
	}
	if got := aws.ToInt64(out.ContentLength); got != u.Size {
		return 0, fmt.Errorf("%w: %s is %d bytes once completed, want %d", ErrVerify, s.remote(rel), got, u.Size)
	}
	return aws.ToTime(out.LastModified).Unix(), nil
}

// symlink makes rel a server-side copy of the file of the plan the link
// points to (S3 has no links), marked with the link's target; one made so
// by an earlier run is left.
func (s *s3Dest) symlink(ctx context.Context, slot int, rel, target string, e entry) error {
	to := path.Clean(path.Join(path.Dir(rel), target))
	f := s.byRel[to]
	if f == nil {
		return errkind.Errorf(errkind.Usage, "S3 has no links, and %s -> %s points at no file this transfer sends: give --dereference to send what it points at", rel, target)
	}
	if f.Size > s3MaxPut {
		return errkind.Errorf(errkind.Usage, "S3 has no links, and %s -> %s is over 5 GiB, too large for a server-side copy: give --dereference", rel, target)
	}
	if e.kind == 'f' && e.size == f.Size {
		s.requests.Add(1)
		if h, err := s.c.API.HeadObject(ctx, &s3api.HeadObjectInput{Bucket: &s.bucket, Key: aws.String(s.c.Key(rel))}); err == nil &&
			h.Metadata[s3MetaLink] == target && h.Metadata[s3MetaSHA256] == f.Digest.Hex() {
			return nil
		}
	}
	meta := metaOf(f)
	meta[s3MetaLink] = target
	if _, err := s.api().CopyObject(ctx, &s3api.CopyObjectInput{Bucket: &s.bucket, Key: aws.String(s.c.Key(rel)),
		CopySource: aws.String((&url.URL{Path: s.bucket + "/" + s.c.Key(to)}).EscapedPath()), MetadataDirective: types.MetadataDirectiveReplace, Metadata: meta}); err != nil {
		return s.classify("copying "+s.remote(to)+" to", rel, err)
	}
	return nil
}

func (s *s3Dest) remove(ctx context.Context, slot int, rel string, dir bool) error {
	if dir {
		return nil // S3 has no directories
	}
	if _, err := s.api().DeleteObject(ctx, &s3api.DeleteObjectInput{Bucket: &s.bucket, Key: aws.String(s.c.Key(rel))}); err != nil {
		return s.classify("removing", rel, err)
	}
	return nil
}
