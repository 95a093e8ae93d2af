package manifest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/store"
)

// FormatVersion is the manifest.json format this package writes. Format 1
// (records keyed with ferry's version) is read and converted (upgradeV1);
// format 2 (every record in manifest.json) is read and its records of
// stages other than imports are written as record objects (SaveUpgrade).
const FormatVersion = 3

// maxManifestSize bounds manifest.json before it is read into memory.
const maxManifestSize = 256 << 20

// StatusComplete is the only status a record is ever written with: a stage
// that has not finished leaves no record (the manifest is the commit point).
const StatusComplete Status = "complete"

// Status is a record's status; it marshals as its string.
type Status string

// Output is one file a stage produced.
type Output struct {
	Path   string `json:"path"` // relative, slash-separated
	Digest Digest `json:"digest"`
	Size   int64  `json:"size"`
}

// Input names the record of an earlier stage this one consumed.
type Input struct {
	Stage string `json:"stage"`
	Key   string `json:"key"`
	// Digest is OutputsDigest of that stage's outputs.
	Digest Digest `json:"digest"`
}

// Record is the result of one completed stage run, keyed by StageKey (kind,
// kind version, canonical params, input digests) or, for a stage that
// reads files outside the store (an import), by SourceKey (what it read).
type Record struct {
	Key      string `json:"key"`
	Pipeline string `json:"pipeline"`
	Stage    string `json:"stage"`
	Kind     string `json:"kind"`
	// FerryVersion is the release that made the record: information, not
	// part of its key.
	FerryVersion string `json:"ferry_version"`
	KindVersion  string `json:"kind_version,omitempty"`
	// Params are canonical (CanonicalJSON); an import's hold no path.
	Params json.RawMessage `json:"params"`
	Inputs []Input         `json:"inputs,omitempty"`
	// Sources are files outside the store the stage read (import), by
	// absolute path, with the stamp they had when read: facts of this
	// machine. A record committed again under its key (the same files
	// imported from another directory) keeps the sources it had too.
	Sources map[string]Stamp `json:"sources,omitempty"`
	// Host is the machine that made the record, when it is a record
	// object (IsObject); an import's is this machine.
	Host     string    `json:"host,omitempty"`
	Outputs  []Output  `json:"outputs"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Status   Status    `json:"status"`
}

// OutputsDigest is the digest of the record's output list (paths, digests and
// sizes, in path order): what a downstream stage's key depends on.
func (r *Record) OutputsDigest() Digest { return OutputsDigest(r.Outputs) }

// OutputsDigest hashes a list of outputs in path order.
func OutputsDigest(outs []Output) Digest {
	o := append([]Output(nil), outs...)
	sort.Slice(o, func(i, j int) bool { return o[i].Path < o[j].Path })
	b, _ := json.Marshal(o)
	return DigestOf(b)
}

// Manifest is the content of manifest.json.
type Manifest struct {
	Version int `json:"version"`
	// Records by key: in memory every record, in manifest.json (format 3)
	// only those that are not record objects (imports).
	Records map[string]*Record `json:"records"`
	// Pipelines maps pipeline name → stage name → key of its latest
	// record; manifest.json holds those naming its own records, the rest
	// are refs.
	Pipelines map[string]map[string]string `json:"pipelines"`
	// Blobs maps a blob's hex digest to the stamp it had when committed or
	// last verified.
	Blobs map[string]Stamp `json:"blobs"`
	// Damaged maps a blob's hex digest to what `store verify` found wrong.
	Damaged map[string]string `json:"damaged,omitempty"`
	// Replacing maps a blob's hex digest to the stamp of the file about to
	// replace it, saved before the rename when the blob replaced is one that
	// records read (an in-place link that a stage's same bytes turn into a
	// real file): a process killed after the rename, before the new stamp
	// is saved, leaves a blob that Load finds with this stamp and takes as
	// intact. Load settles it; it is empty in a manifest written after.
	Replacing map[string]Stamp `json:"replacing,omitempty"`
	// Attempts maps pipeline name → stage name → its latest run that did
	// not end in a record: one that started and was killed or interrupted,
	// or one that failed (with its error). Committing the stage's record
	// clears it.
	Attempts map[string]map[string]*Attempt `json:"attempts,omitempty"`

	// upgradedFrom is the format the file was read in when it was older
	// (converted when decoded), else 0.
	upgradedFrom int
}

// Attempt is a stage run that has not (yet) ended in a record.
type Attempt struct {
	Key     string    `json:"key"` // the stage key: its journals and work dir
	Started time.Time `json:"started"`
	// Error is why the run failed; "" while it runs or after a kill or an
	// interrupt (its journals and work dir are then what a run resumes).
	Error  string     `json:"error,omitempty"`
	Failed *time.Time `json:"failed,omitempty"`
	// Interrupted is when the run was cancelled (Ctrl-C, SIGTERM) while
	// the stage ran; nil while it runs, after a kill (nothing is recorded
	// then) or a failure.
	Interrupted *time.Time `json:"interrupted,omitempty"`
}

func newManifest() *Manifest {
	return &Manifest{
		Version:   FormatVersion,
		Records:   map[string]*Record{},
		Pipelines: map[string]map[string]string{},
		Blobs:     map[string]Stamp{},
		Damaged:   map[string]string{},
		Attempts:  map[string]map[string]*Attempt{},
	}
}

// Store is a content-addressed store directory:
//
//	<root>/blobs/sha256/<hex>   committed blobs, read-only
//	<root>/records/<key>.json   stage records (the commit point), but imports'
//	<root>/refs/pipelines/…     the latest record of each pipeline stage
//	<root>/manifest.json        stamps, attempts, imports' records
//	<root>/format, .tmp, …      the store/local layout (see objects.go)
//	<root>/tmp/                 ingest temp files (garbage after a crash)
//	<root>/ingest/<key>/<ref>/  resume journals of unfinished big outputs
//	<root>/work/<key>/          scratch space of running stages
//	<root>/views/<stage>/       default views (symlinks into blobs)
//	<root>/lock                 the store lock
//
// A Store's methods are safe for concurrent use by the stages of one run;
// two processes must hold the Lock to write one store.
type Store struct {
	Root string

	// objs is the store of package store on Root: record objects and
	// refs (nil when Load found none yet).
	objs *store.Store

	mu sync.Mutex
	m  *Manifest
	// upgraded says manifest.json is of an older format, converted in
	// memory when read (SaveUpgrade writes it); until then manifest.json
	// is written in format 2, every record in it.
	upgraded bool
	// placeMu serialises moving finished files into blobs/, so that two
	// stages committing the same content at once agree on the blob and its
	// stamp.
	placeMu sync.Mutex
}

// ErrCorruptManifest reports a manifest.json that cannot be read.
var ErrCorruptManifest = errors.New("manifest: corrupt manifest.json")

// Open opens (creating if needed) the store at root for writing.
func Open(root string) (*Store, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{"blobs/" + Algorithm, "tmp", "ingest", "work", "views"} {
		if err := os.MkdirAll(filepath.Join(abs, d), 0o755); err != nil {
			return nil, fmt.Errorf("store %s: %w", abs, err)
		}
	}
	objs, err := openObjects(abs, false)
	if err != nil {
		return nil, err
	}
	return load(abs, objs)
}

// Load reads the store at root without creating anything; a store that does
// not exist yet reads as empty. Plan and status use it.
func Load(root string) (*Store, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	objs, err := openObjects(abs, true)
	if err != nil {
		return nil, err
	}
	return load(abs, objs)
}

// load reads manifest.json and then the record objects and refs of objs.
func load(abs string, objs *store.Store) (*Store, error) {
	s := &Store{Root: abs, objs: objs, m: newManifest()}
	if err := s.readManifest(); err != nil {
		return nil, err
	}
	if objs != nil {
		if err := loadObjects(context.Background(), objs, s.m); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// readManifest reads manifest.json into s.m (an empty one when there is
// none).
func (s *Store) readManifest() error {
	p := s.ManifestPath()
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() > maxManifestSize {
		return fmt.Errorf("%s: %w: %d bytes is over the %d-byte limit", p, ErrCorruptManifest, fi.Size(), maxManifestSize)
	}
	m, err := decodeManifest(f)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	s.m, s.upgraded = m, m.upgradedFrom != 0
	s.settleReplacing()
	return nil
}

// settleReplacing ends the replacements that a killed process left in
// Manifest.Replacing: a blob that is now the new file (its stamp is the one
// saved before the rename) takes that stamp; one that is not (killed before
// the rename) keeps the stamp it had.
func (s *Store) settleReplacing() {
	for h, st := range s.m.Replacing {
		p := filepath.Join(s.Root, "blobs", Algorithm, h)
		if cur, err := StatStamp(p); err == nil && cur == st && !isLinkPath(p) {
			s.m.Blobs[h] = st
		}
		delete(s.m.Replacing, h)
	}
}

func decodeManifest(r interface{ Read([]byte) (int, error) }) (*Manifest, error) {
	m := newManifest()
	dec := json.NewDecoder(r)
	if err := dec.Decode(m); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorruptManifest, err)
	}
	if m.Version < 1 || m.Version > FormatVersion {
		return nil, fmt.Errorf("%w: format version %d, want 1 to %d", ErrCorruptManifest, m.Version, FormatVersion)
	}
	if m.Records == nil {
		m.Records = map[string]*Record{}
	}
	if m.Pipelines == nil {
		m.Pipelines = map[string]map[string]string{}
	}
	if m.Blobs == nil {
		m.Blobs = map[string]Stamp{}
	}
	if m.Damaged == nil {
		m.Damaged = map[string]string{}
	}
	if m.Attempts == nil {
		m.Attempts = map[string]map[string]*Attempt{}
	}
	for k, r := range m.Records {
		if r == nil || r.Key != k {
			return nil, fmt.Errorf("%w: record %q does not carry its key", ErrCorruptManifest, k)
		}
		for _, o := range r.Outputs {
			if err := o.Digest.Validate(); err != nil {
				return nil, fmt.Errorf("%w: record %q output %q: %v", ErrCorruptManifest, k, o.Path, err)
			}
			if err := checkRelPath(o.Path); err != nil {
				return nil, fmt.Errorf("%w: record %q: %v", ErrCorruptManifest, k, err)
			}
			if o.Size < 0 {
				return nil, fmt.Errorf("%w: record %q output %q: negative size", ErrCorruptManifest, k, o.Path)
			}
		}
	}
	if m.Version == 1 {
		if err := upgradeV1(m); err != nil {
			return nil, fmt.Errorf("%w: converting format 1: %v", ErrCorruptManifest, err)
		}
		m.upgradedFrom = 1
	}
	if m.Version == 2 {
		if m.upgradedFrom == 0 {
			m.upgradedFrom = 2
		}
		m.Version = FormatVersion
	}
	return m, nil
}

// ManifestPath is <root>/manifest.json.
func (s *Store) ManifestPath() string { return filepath.Join(s.Root, "manifest.json") }

// BlobPath is where the blob with digest d lives.
func (s *Store) BlobPath(d Digest) string {
	return filepath.Join(s.Root, "blobs", Algorithm, d.Hex())
}

// ViewsDir is the default parent of stage views.
func (s *Store) ViewsDir() string { return filepath.Join(s.Root, "views") }

// WorkDir is the scratch directory of the stage run with key.
func (s *Store) WorkDir(key string) string { return filepath.Join(s.Root, "work", key) }

// IngestDir holds the resume journals of the stage run with key.
func (s *Store) IngestDir(key string) string { return filepath.Join(s.Root, "ingest", key) }

// Record returns a copy of the record with key, or nil.
func (s *Store) Record(key string) *Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.m.Records[key]
	if r == nil {
		return nil
	}
	c := *r
	return &c
}

// StageRecord returns a copy of the latest record of a pipeline's stage, or nil.
func (s *Store) StageRecord(pipeline, stage string) *Record {
	s.mu.Lock()
	key := s.m.Pipelines[pipeline][stage]
	s.mu.Unlock()
	if key == "" {
		return nil
	}
	return s.Record(key)
}

// Records returns copies of all records, sorted by key.
func (s *Store) Records() []*Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Record, 0, len(s.m.Records))
	for _, r := range s.m.Records {
		c := *r
		out = append(out, &c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// Damage returns what `store verify` found wrong with blob d ("" if nothing).
func (s *Store) Damage(d Digest) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Damaged[d.Hex()]
}

// NoStamp is what CheckBlob says of a blob this machine has no stamp of:
// placed by `ferry store copy`, or by a stage killed after its record
// object was written and before manifest.json was. A rehash settles it.
const NoStamp = "no stamp recorded"

// CheckBlob says what is wrong with blob d of the given size, or "" when it
// is intact. Without rehash it compares the stamp recorded at commit (size,
// mtime, inode) and reads no data; with rehash it reads and hashes the blob,
// and a blob whose content does not match is marked damaged (as `store
// verify` does; saved with the next manifest write), so that making it
// again replaces it.
func (s *Store) CheckBlob(d Digest, size int64, rehash bool) string {
	if why := s.Damage(d); why != "" {
		return "damaged (" + why + ")"
	}
	p := s.BlobPath(d)
	// An in-place blob is the file it links to: say which.
	where := ""
	if src, ok := s.InPlace(d); ok {
		where = " (read in place from " + src + ")"
	}
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return "missing" + where
	}
	if err != nil {
		return err.Error()
	}
	if fi.Size() != size {
		return fmt.Sprintf("size %d, recorded %d%s", fi.Size(), size, where)
	}
	if rehash {
		got, n, err := HashFile(p)
		if err != nil {
			return err.Error()
		}
		if got != d || n != size {
			// Remembered, so that the blob made again by a re-run replaces
			// this file instead of being taken for a copy already there
			// (the stamp still matches when the damage kept the mtime).
			s.setDamaged(d, "content does not match its digest")
			return "content does not match its digest" + where
		}
		s.setStamp(d, StampOf(fi))
		return ""
	}
	s.mu.Lock()
	st, ok := s.m.Blobs[d.Hex()]
	s.mu.Unlock()
	if !ok {
		return NoStamp
	}
	if st != StampOf(fi) {
		if where != "" {
			return "changed on disk since it was hashed" + where
		}
		return "changed on disk (size/mtime/inode differ from when it was written)"
	}
	return ""
}

func (s *Store) setStamp(d Digest, st Stamp) {
	s.mu.Lock()
	s.m.Blobs[d.Hex()] = st
	delete(s.m.Damaged, d.Hex())
	delete(s.m.Replacing, d.Hex())
	s.mu.Unlock()
}

func (s *Store) setDamaged(d Digest, why string) {
	s.mu.Lock()
	s.m.Damaged[d.Hex()] = why
	s.mu.Unlock()
}

func (s *Store) stamp(d Digest) (Stamp, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.m.Blobs[d.Hex()]
	return st, ok
}

// Commit records rec as the latest run of its pipeline stage and rewrites
// manifest.json atomically. Every output blob must already be committed (it
// is checked): a record never refers to a blob that is not durable.
func (s *Store) Commit(rec *Record) error {
	for _, o := range rec.Outputs {
		if err := checkRelPath(o.Path); err != nil {
			return err
		}
		fi, err := os.Stat(s.BlobPath(o.Digest))
		if errors.Is(err, fs.ErrNotExist) {
			err = errkind.Mark(errkind.VerifyFailed, err) // a blob vanished: damage, not bad input
		}
		if err != nil {
			return fmt.Errorf("commit %s: output %q: blob %s: %w", rec.Stage, o.Path, o.Digest.Short(), err)
		}
		if fi.Size() != o.Size {
			return errkind.Errorf(errkind.VerifyFailed, "commit %s: output %q: blob %s is %d bytes, record says %d", rec.Stage, o.Path, o.Digest.Short(), fi.Size(), o.Size)
		}
	}
	rec.Status = StatusComplete
	c := *rec
	if s.objs != nil && IsObject(rec) {
		// The record object is the commit point; the ref then says it
		// is the stage's latest.
		ctx := context.Background()
		stored, err := s.putObject(ctx, rec)
		if err != nil {
			return fmt.Errorf("commit %s: %w", rec.Stage, err)
		}
		c = *stored
		if rec.Pipeline != "" {
			if err := s.pointRef(ctx, rec.Pipeline, rec.Stage, rec.Key); err != nil {
				return fmt.Errorf("commit %s: %w", rec.Stage, err)
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.m.Records[rec.Key]; old != nil && len(old.Sources) > 0 && len(c.Sources) > 0 {
		// The same files read from another place: each place keeps its
		// stamps, so that neither import re-runs because of the other.
		srcs := make(map[string]Stamp, len(old.Sources)+len(c.Sources))
		for p, st := range old.Sources {
			srcs[p] = st
		}
		for p, st := range c.Sources {
			srcs[p] = st
		}
		c.Sources = srcs
	}
	s.m.Records[rec.Key] = &c
	if rec.Pipeline != "" {
		if s.m.Pipelines[rec.Pipeline] == nil {
			s.m.Pipelines[rec.Pipeline] = map[string]string{}
		}
		s.m.Pipelines[rec.Pipeline][rec.Stage] = rec.Key
		s.clearAttemptLocked(rec.Pipeline, rec.Stage)
	}
	return s.saveLocked()
}

// BeginAttempt records that a pipeline stage starts a run with key, so
// that status can tell a stage killed halfway (and what it left to resume)
// from one that never ran. It saves the manifest.
func (s *Store) BeginAttempt(pipeline, stage, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setAttemptLocked(pipeline, stage, &Attempt{Key: key, Started: time.Now().UTC()})
	return s.saveLocked()
}

// FailAttempt records that the run of a pipeline stage with key failed, and
// why, and saves the manifest. The stage's record, if one was committed
// (a run whose view then failed), stays.
func (s *Store) FailAttempt(pipeline, stage, key, why string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.m.Attempts[pipeline][stage]
	if a == nil || a.Key != key {
		a = &Attempt{Key: key, Started: time.Now().UTC()}
	}
	now := time.Now().UTC()
	a.Error, a.Failed = why, &now
	s.setAttemptLocked(pipeline, stage, a)
	return s.saveLocked()
}

// InterruptAttempt records that the run of a pipeline stage with key was
// interrupted (its context cancelled: Ctrl-C, SIGTERM) while it ran, and
// saves the manifest. What it wrote stays for the next run to resume.
func (s *Store) InterruptAttempt(pipeline, stage, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.m.Attempts[pipeline][stage]
	if a == nil || a.Key != key {
		a = &Attempt{Key: key, Started: time.Now().UTC()}
	}
	now := time.Now().UTC()
	a.Interrupted = &now
	s.setAttemptLocked(pipeline, stage, a)
	return s.saveLocked()
}

// EndAttempt clears what BeginAttempt, FailAttempt and InterruptAttempt
// recorded for a pipeline stage (it is done, or found up to date), saving
// the manifest only if there was something to clear.
func (s *Store) EndAttempt(pipeline, stage string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m.Attempts[pipeline][stage] == nil {
		return nil
	}
	s.clearAttemptLocked(pipeline, stage)
	return s.saveLocked()
}

// Attempt returns a copy of the unfinished or failed run of a pipeline
// stage, or nil.
func (s *Store) Attempt(pipeline, stage string) *Attempt {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.m.Attempts[pipeline][stage]
	if a == nil {
		return nil
	}
	c := *a
	return &c
}

func (s *Store) setAttemptLocked(pipeline, stage string, a *Attempt) {
	if s.m.Attempts[pipeline] == nil {
		s.m.Attempts[pipeline] = map[string]*Attempt{}
	}
	s.m.Attempts[pipeline][stage] = a
}

func (s *Store) clearAttemptLocked(pipeline, stage string) {
	delete(s.m.Attempts[pipeline], stage)
	if len(s.m.Attempts[pipeline]) == 0 {
		delete(s.m.Attempts, pipeline)
	}
}

// Resumable is how many bytes the unfinished run with key left in the
// store for a later run to continue from: its journals and its work dir.
// It reads no file data.
func (s *Store) Resumable(key string) int64 {
	if _, err := hex.DecodeString(key); err != nil || len(key) != 2*sha256.Size {
		return 0 // not a stage key (a hand-edited manifest): look nowhere
	}
	var n int64
	for _, d := range []string{s.IngestDir(key), s.WorkDir(key)} {
		filepath.WalkDir(d, func(_ string, de fs.DirEntry, err error) error {
			if err == nil && de.Type().IsRegular() {
				if fi, err := de.Info(); err == nil {
					n += fi.Size()
				}
			}
			return nil
		})
	}
	return n
}

// Save rewrites manifest.json atomically.
func (s *Store) Save() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.saveLocked()
}

func (s *Store) saveLocked() error {
	m := *s.m
	if s.objs == nil || s.upgraded {
		// Not converted yet: every record stays in manifest.json.
		m.Version = 2
	} else {
		m.Records = map[string]*Record{}
		for k, r := range s.m.Records {
			if !IsObject(r) {
				m.Records[k] = r
			}
		}
		m.Pipelines = map[string]map[string]string{}
		for p, stages := range s.m.Pipelines {
			for st, k := range stages {
				if m.Records[k] == nil {
					continue // a ref
				}
				if m.Pipelines[p] == nil {
					m.Pipelines[p] = map[string]string{}
				}
				m.Pipelines[p][st] = k
			}
		}
	}
	b, err := json.MarshalIndent(&m, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	return fsutil.WriteFileAtomic(s.ManifestPath(), b, 0o644)
}

// PipelineStages returns stage name → key for a pipeline.
func (s *Store) PipelineStages(pipeline string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	for k, v := range s.m.Pipelines[pipeline] {
		out[k] = v
	}
	return out
}

// Link points a pipeline stage at an existing record (a run that found its
// key already done, perhaps by another stage or pipeline) and saves the
// manifest if that changed anything.
func (s *Store) Link(pipeline, stage, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.m.Records[key]
	if rec == nil {
		return fmt.Errorf("link %s/%s: no record %s", pipeline, stage, key)
	}
	if s.m.Pipelines[pipeline][stage] == key {
		return nil
	}
	if s.objs != nil && IsObject(rec) {
		if err := s.pointRef(context.Background(), pipeline, stage, key); err != nil {
			return fmt.Errorf("link %s/%s: %w", pipeline, stage, err)
		}
	}
	if s.m.Pipelines[pipeline] == nil {
		s.m.Pipelines[pipeline] = map[string]string{}
	}
	s.m.Pipelines[pipeline][stage] = key
	return s.saveLocked()
}

// SaveUpgrade writes the store in the current format if manifest.json was
// read in an older one (converted in memory by Load): the records that
// are record objects now are written as such with their refs, then
// manifest.json, once, atomically: a kill leaves the old file or the new
// one. Call it holding the lock.
func (s *Store) SaveUpgrade() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.upgraded {
		return nil
	}
	if s.objs == nil {
		objs, err := openObjects(s.Root, false)
		if err != nil {
			return err
		}
		s.objs = objs
	}
	// The records become objects, then the stages' pointers refs;
	// manifest.json without them is written last: a kill before
	// leaves format 2, converted again (the objects written stand).
	ctx := context.Background()
	for k, r := range s.m.Records {
		if !IsObject(r) {
			continue
		}
		stored, err := s.putObject(ctx, r)
		if errors.Is(err, store.ErrBlobMissing) || errors.Is(err, store.ErrDigestMismatch) {
			// A record whose blob is gone or damaged: its stage is
			// made again, as it would have been.
			delete(s.m.Records, k)
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: converting record %s: %w", s.ManifestPath(), k, err)
		}
		s.m.Records[k] = stored
	}
	for p, stages := range s.m.Pipelines {
		for st, k := range stages {
			if r := s.m.Records[k]; r != nil && IsObject(r) {
				if err := s.pointRef(ctx, p, st, k); err != nil {
					return fmt.Errorf("%s: converting %s/%s: %w", s.ManifestPath(), p, st, err)
				}
			}
		}
	}
	s.upgraded = false
	if err := s.saveLocked(); err != nil {
		s.upgraded = true
		return err
	}
	return nil
}

// Reload re-reads manifest.json. Call it after taking the lock: another run
// may have committed records since the store was opened.
func (s *Store) Reload() error {
	objs := s.objs
	if objs == nil {
		var err error
		if objs, err = openObjects(s.Root, true); err != nil {
			return err
		}
	}
	fresh, err := load(s.Root, objs)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.m, s.upgraded, s.objs = fresh.m, fresh.upgraded, objs
	s.mu.Unlock()
	return nil
}
