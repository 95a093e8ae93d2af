package transfer

import (
	"context"
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"
	"golang.org/x/sync/errgroup"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/s3client"
)

// An S3 source: s3://BUCKET/PREFIX/NAME is the object PREFIX/NAME (sent as
// the file NAME) or, where there is none, the objects under PREFIX/NAME/
// (sent as the directory NAME/…, as scp -r sends a directory). The plan
// is made from one listing: each file's size and ETag, and the sha256
// ferry recorded in the object's metadata (x-amz-meta-ferry-sha256, read
// by a HEAD of each object larger than a chunk) or that a digest cache
// learnt from an earlier read of the same ETag. A file whose sha256 is
// known neither way is hashed as it is read for sending (an object of one
// chunk: its GET, which carries the metadata too). The fan-out core reads
// an object's bytes by ranged GETs, each with If-Match of the ETag the
// listing saw: an object replaced during the copy is an error naming it
// (ErrSourceChanged), never a file of two versions.

// s3Source is one object a plan's File is read from.
type s3Source struct {
	c    *s3client.Client
	key  string // under c.Prefix
	etag string
}

// srcReadsS3 is how many ranged GETs of one object are under way at once,
// and how many small objects are fetched at once: a GET is a round trip
// before its first byte, and one TCP stream moves at most its window per
// round trip.
const (
	srcReadsS3      = 16
	srcSmallReadsS3 = 64
)

func (s *s3Source) where() string { return s.c.Where(s.key) }

// ident names the object's version for the resume journal's ref: chunks
// journaled from one version are never taken for another's.
func (s *s3Source) ident() string { return s.where() + "\x00" + s.etag }

// readAt reads len(p) bytes at off of the version planned; meta is the
// object's metadata.
func (s *s3Source) readAt(ctx context.Context, p []byte, off int64) (map[string]string, error) {
	if len(p) == 0 {
		return nil, nil
	}
	meta, err := s.c.GetRangeMatch(ctx, s.key, s.etag, off, p, s.c.Classify)
	if s3client.CodeOf(err) == s3client.Precondition || s3client.CodeOf(err) == s3client.NotFound {
		return nil, fmt.Errorf("%s: %w: it is no longer the version listed when the copy began (ETag %s)", s.where(), ErrSourceChanged, s.etag)
	}
	return meta, err
}

// S3Source says whether a source argument names objects in S3.
func S3Source(arg string) bool { return s3client.IsURL(arg) }

// S3Object is one object of an S3 source as its listing gives it.
type S3Object struct {
	Rel  string // its path at a destination: NAME, or NAME/… under the source's NAME/
	URL  string // s3://BUCKET/KEY
	ETag string // the version listed
	Size int64
}

// ListS3 lists the source url (s3://BUCKET/PREFIX/NAME) as NewS3Plan
// would send it: the object NAME, or every object under NAME/ (by Rel).
func ListS3(ctx context.Context, url string) ([]S3Object, error) {
	_, objs, _, err := listS3(ctx, url)
	out := make([]S3Object, len(objs))
	for i, o := range objs {
		out[i] = S3Object{Rel: o.rel, URL: o.url, ETag: o.etag, Size: o.size}
	}
	return out, err
}

type s3Obj struct {
	rel, key, url, etag string
	size                int64
}

// listS3 lists the source url: its client (at NAME's parent), its objects
// sorted by rel, and the top directory's name ("" for a single object).
func listS3(ctx context.Context, url string) (*s3client.Client, []s3Obj, string, error) {
	bucket, prefix, err := s3client.ParseURL(url)
	if err != nil {
		return nil, nil, "", err
	}
	// The client's prefix is the parent of NAME: the files' keys under it
	// are their paths at the destination.
	name := path.Base(strings.TrimSuffix(prefix, "/"))
	parent := strings.TrimSuffix(strings.TrimSuffix(prefix, "/"), name)
	top := name
	if prefix == "" {
		name, top = "", bucket // the whole bucket, sent as a directory named after it
	}
	c, err := s3client.Open(ctx, "s3://"+bucket+"/"+parent, s3client.Options{})
	if err != nil {
		return nil, nil, "", err
	}
	var objs []s3Obj
	single := false
	pg := s3api.NewListObjectsV2Paginator(c.API, &s3api.ListObjectsV2Input{Bucket: &c.Bucket, Prefix: aws.String(c.Key(name))})
	for pg.HasMorePages() {
		page, err := pg.NextPage(ctx)
		if err != nil {
			return nil, nil, "", c.Classify("listing", name, err)
		}
		for _, o := range page.Contents {
			key := strings.TrimPrefix(aws.ToString(o.Key), c.Prefix)
			var rest string
			switch {
			case key == name && name != "":
				single = true
			case name == "":
				rest = key
			case strings.HasPrefix(key, name+"/"):
				rest = strings.TrimPrefix(key, name+"/")
			default:
				continue // NAMEx…: another name
			}
			if strings.HasSuffix(key, "/") {
				continue // a "directory" marker
			}
			rel := top
			if key != name || name == "" {
				if err := checkObjectRel(rest); err != nil {
					return nil, nil, "", errkind.Errorf(errkind.BadInput, "%s: %v: not sent as a file name", c.Where(key), err)
				}
				rel = top + "/" + rest
			}
			if len(objs) >= maxObjects {
				return nil, nil, "", errkind.Errorf(errkind.Usage, "%s: more than %d objects", url, maxObjects)
			}
			objs = append(objs, s3Obj{rel: rel, key: key, url: c.Where(key), etag: aws.ToString(o.ETag), size: aws.ToInt64(o.Size)})
		}
	}
	if single {
		// The object NAME is the file; what is under NAME/ is not sent.
		var one []s3Obj
		for _, o := range objs {
			if o.key == name {
				one = append(one, o)
			}
		}
		objs, top = one, ""
	}
	if len(objs) == 0 {
		return nil, nil, "", errkind.Errorf(errkind.BadInput, "%s: no object there or under it", url)
	}
	sort.Slice(objs, func(i, j int) bool { return objs[i].rel < objs[j].rel })
	return c, objs, top, nil
}

// Object says, for a file of an S3 source, which object version it is
// read from (ok false: a local file).
func (f *File) Object() (url, etag string, ok bool) {
	s, ok := f.src.(*s3Source)
	if !ok {
		return "", "", false
	}
	return f.Path, s.etag, true
}

// NewS3Plan lists the source url (s3://BUCKET/PREFIX/NAME: one object, or
// every object under it) into a plan. opts.Cache gives the sha256 of
// objects read before (by key, size and ETag); opts.Dereference, Jobs and
// Hashed are not used (nothing is hashed before sending). The endpoint, region and credentials are read as every S3
// tool reads them.
func NewS3Plan(ctx context.Context, url string, opts PlanOptions) (*Plan, error) {
	p := &Plan{ChunkSize: opts.ChunkSize}
	if p.ChunkSize <= 0 {
		p.ChunkSize = DefaultChunkSize
	}
	c, objs, top, err := listS3(ctx, url)
	if err != nil {
		return nil, err
	}
	if top != "" {
		p.Dirs = append(p.Dirs, top)
	}
	for _, o := range objs {
		f := File{Rel: o.rel, Path: o.url, Size: o.size, Perm: 0o644,
			src: &s3Source{c: c, key: o.key, etag: o.etag}}
		if d, ok := opts.Cache.lookupObject(f.Path, o.etag, o.size); ok {
			f.Digest = d
		}
		f.digestLater = f.Digest == "" && p.small(&f)
		p.Files = append(p.Files, f)
		for dir := path.Dir(o.rel); dir != "." && dir != top; dir = path.Dir(dir) {
			p.Dirs = append(p.Dirs, dir)
		}
	}
	if err := p.check(); err != nil {
		return nil, err
	}
	// The sha256 ferry recorded: one HEAD (If-Match) of each larger object
	// whose digest is not known.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(srcReadsS3)
	for i := range p.Files {
		f := &p.Files[i]
		if f.Digest != "" || p.small(f) {
			continue
		}
		g.Go(func() error {
			s := f.src.(*s3Source)
			h, err := c.API.HeadObject(gctx, &s3api.HeadObjectInput{Bucket: &c.Bucket, Key: aws.String(c.Key(s.key)), IfMatch: aws.String(s.etag)})
			if err != nil {
				if err = c.Classify("head", s.key, err); s3client.CodeOf(err) == s3client.Precondition || s3client.CodeOf(err) == s3client.NotFound {
					return fmt.Errorf("%s: %w since it was listed", s.where(), ErrSourceChanged)
				}
				return err
			}
			if d, err := digest.FromHex(h.Metadata[s3MetaSHA256]); err == nil {
				f.Digest, f.claimed = d, true
			} else {
				f.digestLater = true
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return p, nil
}

// maxObjects bounds the objects one S3 source lists.
const maxObjects = 10_000_000

// checkObjectRel refuses a key that is no relative path to write: an
// empty, "." or ".." element, a NUL, a backslash (a separator elsewhere).
func checkObjectRel(rest string) error {
	if rest == "" {
		return fmt.Errorf("empty name")
	}
	if strings.ContainsAny(rest, "\x00\\") {
		return fmt.Errorf("a NUL or backslash in its name")
	}
	for _, e := range strings.Split(rest, "/") {
		if e == "" || e == "." || e == ".." {
			return fmt.Errorf("an empty, \".\" or \"..\" element in its name")
		}
	}
	return nil
}

// checkMeta compares the sha256 in an object's metadata (meta, from a GET
// of it) with d, the digest of its bytes as read: a mismatch is an object
// whose metadata lies (or whose bytes were altered in storage).
func checkMeta(f *File, meta map[string]string, d digest.Digest) error {
	want, err := digest.FromHex(meta[s3MetaSHA256])
	if err != nil || want == d {
		return nil
	}
	return fmt.Errorf("%s: %w: its metadata (x-amz-meta-%s) records %s, its bytes read are %s", f.Path, ErrSourceDigest, s3MetaSHA256, want.Short(), d.Short())
}

// ErrSourceDigest is wrapped by errors about an object whose bytes do not
// hash to the sha256 its metadata records.
var ErrSourceDigest = errkind.New(errkind.VerifyFailed, "the source's bytes do not match its recorded sha256")

// checkRead compares d, the digest of a file's bytes as read, with the
// plan's. A file whose digest was not known (HashLater, an object without
// ferry's metadata) takes d, once the object's metadata (meta, where the
// read gave it) agrees.
func checkRead(p *Plan, f *File, d digest.Digest, meta map[string]string) error {
	switch {
	case f.Digest == "":
		if err := checkMeta(f, meta, d); err != nil {
			return err
		}
		p.learnt(f, d)
		return nil
	case d == f.Digest:
		return nil
	case f.claimed:
		return fmt.Errorf("%s: %w: its metadata (x-amz-meta-%s) records %s, its bytes read are %s", f.Path, ErrSourceDigest, s3MetaSHA256, f.Digest.Short(), d.Short())
	}
	return fmt.Errorf("%s: %w: it was %s when planned, its bytes read for sending are %s", f.Path, ErrSourceChanged, f.Digest.Short(), d.Short())
}

// readObjectChunks is readLarge's reading of a file that is an object:
// srcReadsS3 ranged GETs at once within the budget, each chunk handed on
// in order as it arrives. A chunk that no destination lacks and whose
// digest every destination's journal agrees on is not read again (a
// resumed copy fetches only what is missing) where the file's digest is
// known before reading: each destination then checks the whole file.
func readObjectChunks(ctx context.Context, f *File, i int, hs []*host, b *budget, hasher *inOrder, rf *readFile, fail func(error)) {
	cs := hs[0].p.ChunkSize
	n := len(rf.sums)
	type fetch struct {
		j    *job
		to   []*host
		err  error
		done chan error // nil: a chunk not read (j.skip)
	}
	window := make(chan *fetch, srcReadsS3)
	stop := make(chan struct{})
	go func() {
		defer close(window)
		for idx := range n {
			var to []*host
			alive, agree := false, !f.digestLater
			var known digest.Digest
			for _, h := range hs {
				if h.err() != nil {
					continue
				}
				alive = true
				if h.ups[i].need[idx] {
					to = append(to, h)
					continue
				}
				st := h.stateOf(f.Rel)
				h.jmu.Lock()
				d := st.chunks[idx]
				h.jmu.Unlock()
				if d == "" || (known != "" && d != known) {
					agree = false
				}
				known = d
			}
			if !alive {
				return
			}
			off := int64(idx) * cs
			fe := &fetch{}
			if len(to) == 0 && agree && known != "" {
				fe.j = &job{rf: rf, idx: idx, off: off, skip: true}
				rf.sums[idx], rf.skipped = known, true
			} else {
				size := min(cs, f.Size-off)
				if err := b.acquire(ctx, size); err != nil {
					fe.err = err
				} else {
					fe.j = &job{rf: rf, idx: idx, off: off, data: b.chunk(size), bytes: size, b: b, pooled: true}
					fe.to, fe.done = to, make(chan error, 1)
					if hookSourceRead != nil {
						hookSourceRead(f.Rel, off)
					}
					go func() {
						_, err := f.src.readAt(ctx, fe.j.data, off)
						fe.done <- err
					}()
				}
			}
			select {
			case window <- fe:
			case <-stop:
				if fe.done != nil {
					<-fe.done
					b.release(fe.j.data, fe.j.bytes)
				}
				return
			}
			if fe.err != nil {
				return
			}
		}
	}()
	var failed error
	for fe := range window {
		err := fe.err
		if fe.done != nil {
			if err = <-fe.done; err != nil || failed != nil {
				b.release(fe.j.data, fe.j.bytes)
			}
		}
		if failed != nil {
			continue // draining what was under way
		}
		if err != nil {
			failed = err
			close(stop)
			continue
		}
		j := fe.j
		if j.skip {
			j.refs.Store(1) // the whole-file hash's
			hasher.ch <- j
			continue
		}
		// Held by the writers, the whole-file hash, and the chunk's own
		// digest (computed beside the reading).
		j.refs.Store(int32(len(fe.to)) + 2)
		rf.sum.Add(1)
		go func() { j.digest(); rf.sum.Done(); j.release() }()
		hasher.ch <- j
		for _, h := range fe.to {
			select {
			case h.chunkQ <- chunkJob{u: h.ups[i], j: j}:
			case <-h.ctx.Done():
				j.release()
			}
		}
	}
	if failed != nil {
		fail(failed)
	}
}
