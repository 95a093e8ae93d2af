package transfer

import (
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/fsutil"
)

// DigestCache remembers the sha256 of source files by path and stamp
// (size, mtime, inode): a file whose stamp has not changed since it was
// hashed is not read again, so planning an unchanged tree costs a stat
// per file. A file modified within the second it was hashed in may keep
// its stamp; such an entry is not kept (git's "racily clean" rule), and
// the file is hashed again next time.
type DigestCache struct {
	path string
	mu   sync.Mutex
	m    map[string]cacheEntry
	used map[string]bool
	now  func() time.Time
}

type cacheEntry struct {
	Stamp  fsutil.Stamp  `json:"stamp"`
	Digest digest.Digest `json:"digest"`
	ETag   string        `json:"etag,omitempty"` // an object's (keyed by its s3:// URL; the stamp holds its size)
}

// DigestCacheFile is the cache's name in a transfer state directory.
const DigestCacheFile = "source-digests.json"

// maxCacheEntries bounds the cache: when saved, entries not used by this
// run are dropped beyond it.
const maxCacheEntries = 1 << 20

// OpenDigestCache reads the cache at path. One that is missing or does
// not parse is empty (its files are hashed again): the cache only saves
// work.
func OpenDigestCache(path string) *DigestCache {
	c := &DigestCache{path: path, m: map[string]cacheEntry{}, used: map[string]bool{}, now: time.Now}
	f, err := os.Open(path)
	if err != nil {
		return c
	}
	defer f.Close()
	var m map[string]cacheEntry
	if json.NewDecoder(io.LimitReader(f, maxIndex)).Decode(&m) == nil {
		for p, e := range m {
			if e.Digest.Validate() == nil {
				c.m[p] = e
			}
		}
	}
	return c
}

func cacheKey(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// Lookup returns the digest of the file at p if its stamp is st.
func (c *DigestCache) Lookup(p string, st fsutil.Stamp) (digest.Digest, bool) {
	if c == nil {
		return "", false
	}
	k := cacheKey(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok || e.Stamp != st {
		return "", false
	}
	c.used[k] = true
	return e.Digest, true
}

// Store records that the file at p, of stamp st, has digest d.
func (c *DigestCache) Store(p string, st fsutil.Stamp, d digest.Digest) {
	if c == nil {
		return
	}
	k := cacheKey(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Duration(c.now().UnixNano()-st.MtimeNs) < 2*time.Second {
		delete(c.m, k) // racy: the file may change again within its mtime's tick
		return
	}
	c.m[k] = cacheEntry{Stamp: st, Digest: d}
	c.used[k] = true
}

// lookupObject returns the digest of the object at url (s3://…) if its
// ETag and size are etag and size: an ETag names one version of an
// object, which never changes in place.
func (c *DigestCache) lookupObject(url, etag string, size int64) (digest.Digest, bool) {
	if c == nil || etag == "" {
		return "", false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[url]
	if !ok || e.ETag != etag || e.Stamp.Size != size {
		return "", false
	}
	c.used[url] = true
	return e.Digest, true
}

// StoreObjects records the digests of the plan's objects (its S3 source's
// files) that are known: those read and hashed by a run, for the next.
func (c *DigestCache) StoreObjects(p *Plan) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range p.Files {
		f := &p.Files[i]
		s, ok := f.src.(*s3Source)
		if !ok || f.Digest == "" || s.etag == "" {
			continue
		}
		c.m[f.Path] = cacheEntry{Stamp: fsutil.Stamp{Size: f.Size}, Digest: f.Digest, ETag: s.etag}
		c.used[f.Path] = true
	}
}

// Save writes the cache atomically.
func (c *DigestCache) Save() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) > maxCacheEntries {
		var old []string
		for k := range c.m {
			if !c.used[k] {
				old = append(old, k)
			}
		}
		sort.Strings(old)
		for _, k := range old[:min(len(old), len(c.m)-maxCacheEntries)] {
			delete(c.m, k)
		}
	}
	b, err := json.Marshal(c.m)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(c.path), 0o755); err != nil {
		return err
	}
	err = fsutil.WriteFileAtomic(c.path, b, 0o644)
	if errors.Is(err, fs.ErrPermission) {
		return nil // a read-only state directory only costs the next run a hash
	}
	return err
}
