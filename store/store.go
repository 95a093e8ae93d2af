package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ferry-llm/ferry/internal/cpushare"
	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/errkind"
)

// FormatVersion is the layout this package writes, in the "format" object.
const FormatVersion = 1

// Defaults of Options.
const (
	DefaultPartSize = 16 << 20
	DefaultParallel = 4
	// DefaultCheckpointEvery bounds what a killed download loses to about
	// a second of fetching.
	DefaultCheckpointEvery = time.Second
)

// Options set up a Store.
type Options struct {
	// CacheDir holds this machine's resume journals of uploads
	// (CacheDir/uploads/<hex>). Default: the user cache directory's
	// ferry/store.
	CacheDir string
	// PartSize is the multipart part size and the ranged-read chunk
	// size (DefaultPartSize; at least MinPartSize). Memory in flight is
	// about PartSize × (Parallel + 1).
	PartSize int64
	// Parallel is the number of parts or chunks in flight (DefaultParallel).
	Parallel int
	// UploadParallel is the number of parts of one multipart upload in
	// flight (default Parallel).
	UploadParallel int
	// UploadInFlight bounds the parts in flight over all of the store's
	// uploads at once, and with them the part buffers: uploads side by
	// side share it, and an upload alone may have UploadParallel parts
	// moving (the last ones of a run, which it waits for). A part of the
	// largest blob waiting goes first: its completion takes the longest
	// (a gateway on a file system joins the parts by copying them, one
	// core's work), so it is started while the smaller ones still move,
	// and the upload that ends a run is a small one; but an upload with
	// no part moving gets one before that, so none waits for the larger
	// ones to end. 0: no bound but each upload's own (UploadParallel+1
	// buffers).
	UploadInFlight int
	// Cores, if set, are the process's cores, handed out by priority
	// (cpushare) to the work beside the store's uploads (a pipeline's
	// stages): each part uploaded takes one first, at a priority above
	// all that work, while ferry hashes it; and, when the storage's
	// server runs on this machine (a Backend that says so: an S3 gateway
	// on a loopback address, whose CPU the part's request spends too),
	// until the server has stored it. The work beside the upload then
	// leaves it the cores it needs, so that the upload (and the server's
	// join of its parts) ends while that work goes on, not after it.
	Cores *cpushare.Gate
	// Host names this machine in leases and records (default: the host
	// name).
	Host string
	// SkipProbe opens the store without probing its conditional writes
	// (read-only commands; ferry store doctor probes it itself).
	SkipProbe bool
	// CheckpointEvery is how often a download is made durable and its
	// point journaled, to resume from after a kill (DefaultCheckpointEvery).
	CheckpointEvery time.Duration
	// Existing refuses to make a new store: the format object must be
	// there (ErrNoStore otherwise).
	Existing bool
	// ResumeLeases journals the id of each lease taken under CacheDir
	// (CacheDir/leases/), so that a later process with this CacheDir
	// takes a lease its killed predecessor held over at once, instead of
	// waiting for its ttl. Only for a CacheDir one process uses at a time
	// (a pipeline's cache, under its lock).
	ResumeLeases bool
}

// ErrNoStore reports a location that holds no store (Options.Existing).
var ErrNoStore = errkind.New(errkind.BadInput, "store: no ferry store there")

// Store is the content-addressed store on a Backend.
type Store struct {
	b   Backend
	opt Options
	// probe is what Open's probe found (nil with SkipProbe).
	probe *ProbeReport
	// live are the leases this process holds (shared by WithHost's
	// copies).
	live *liveLeases
	// uploads holds a token per part in flight over all uploads
	// (Options.UploadInFlight; nil: unbounded), given to the largest
	// blob's parts first; bufs keeps the part buffers between them.
	uploads *cpushare.Gate
	bufs    *sync.Pool
	// local: the backend's server runs on this machine (OnThisMachine).
	local bool
}

// ErrNotShareable reports storage that failed the conditional-write probe:
// several machines must not share it.
var ErrNotShareable = errkind.New(errkind.Usage, "store: the server does not honour conditional writes")

// Open opens the store on b: it probes b's conditional writes (unless
// opt.SkipProbe) and refuses storage that fails, then writes the format
// object if the store is new, or checks it.
func Open(ctx context.Context, b Backend, opt Options) (*Store, error) {
	if opt.PartSize == 0 {
		opt.PartSize = DefaultPartSize
	}
	if opt.PartSize < MinPartSize {
		return nil, fmt.Errorf("store: part size %d is under the %d-byte minimum", opt.PartSize, MinPartSize)
	}
	if opt.Parallel <= 0 {
		opt.Parallel = DefaultParallel
	}
	if opt.UploadParallel <= 0 {
		opt.UploadParallel = opt.Parallel
	}
	if opt.CheckpointEvery <= 0 {
		opt.CheckpointEvery = DefaultCheckpointEvery
	}
	if opt.Host == "" {
		opt.Host, _ = os.Hostname()
	}
	if opt.CacheDir == "" {
		d, err := os.UserCacheDir()
		if err != nil {
			return nil, fmt.Errorf("store: no cache directory: %w", err)
		}
		opt.CacheDir = d + "/ferry/store"
	}
	s := &Store{b: b, opt: opt, live: &liveLeases{m: map[string]*Lease{}}, bufs: &sync.Pool{}, local: onThisMachine(b)}
	if opt.UploadInFlight > 0 {
		s.uploads = cpushare.New(opt.UploadInFlight)
	}
	if !opt.SkipProbe {
		rep := Probe(ctx, b)
		if err := rep.Err(); err != nil {
			return nil, err
		}
		s.probe = rep
	}
	if err := s.checkFormat(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Backend is the storage the store is on.
func (s *Store) Backend() Backend { return s.b }

func (s *Store) String() string { return s.b.String() }

// Host is the name of this machine in the records and leases s writes.
func (s *Store) Host() string { return s.opt.Host }

type formatObject struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
}

const formatName = "ferry-store"

func (s *Store) checkFormat(ctx context.Context) error {
	if !s.opt.Existing {
		want, _ := json.Marshal(formatObject{Format: formatName, Version: FormatVersion})
		_, err := s.b.Put(ctx, "format", append(want, '\n'), PutOptions{IfNoneMatch: true})
		if err == nil {
			return nil
		}
		if !errors.Is(err, ErrPrecondition) {
			return err
		}
	}
	body, _, err := s.b.Get(ctx, "format", 1<<10)
	if errors.Is(err, ErrNotFound) {
		return fmt.Errorf("%s: %w (no format object)", s.b, ErrNoStore)
	}
	if err != nil {
		return err
	}
	var f formatObject
	if err := json.Unmarshal(body, &f); err != nil || f.Format != formatName {
		return errkind.Errorf(errkind.BadInput, "%s: not a ferry store (its format object is %q)", s.b, strings.TrimSpace(string(body)))
	}
	if f.Version != FormatVersion {
		return errkind.Errorf(errkind.NotBuilt, "%s: store format %d, this ferry reads format %d", s.b, f.Version, FormatVersion)
	}
	return nil
}

// BlobKey is the object key of a blob.
func BlobKey(d digest.Digest) string { return "blobs/" + digest.Algorithm + "/" + d.Hex() }

// checkName checks a record key, ref or lease name: slash-separated
// elements of letters, digits, '.', '_' and '-', none of them "." or "..".
func checkName(what, name string) error {
	if name == "" || len(name) > 512 {
		return errkind.Errorf(errkind.Usage, "store: bad %s name %q", what, name)
	}
	for _, el := range strings.Split(name, "/") {
		if el == "" || el == "." || el == ".." {
			return errkind.Errorf(errkind.Usage, "store: bad %s name %q", what, name)
		}
		for _, c := range el {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
				return errkind.Errorf(errkind.Usage, "store: bad %s name %q", what, name)
			}
		}
	}
	return nil
}

// WithHost is s naming this machine host in the records and leases it
// writes.
func (s *Store) WithHost(host string) *Store {
	c := *s
	c.opt.Host = host
	return &c
}
