package manifest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/store"
	"github.com/ferry-llm/ferry/store/local"
)

// A store directory is also a store of package store on its own directory
// (store/local): the blobs are the same files (blobs/sha256/<hex>), and the
// records of stages that read only the store (every kind but import) are
// its record objects, records/<key>.json, with the pipeline stages'
// pointers as its refs, refs/pipelines/<pipeline>/<stage>. Those records
// are written once and never changed, the refs by compare-and-swap, the
// same way on a directory as in a bucket, so `ferry store copy` moves
// them between a machine's store and a shared one as they are.
//
// manifest.json keeps what is this machine's alone: the blobs' stamps,
// damage marks, attempts, and the records of imports (they name files
// outside the store by absolute path) with the pipeline stages pointing at
// them. Format 2 kept every record there; it is converted once, under the
// lock (SaveUpgrade), like format 1.

// RecordMeta is what a store record keeps beside its outputs: what made
// it, for people and for the machines that read it. Nothing in it is a
// path or a fact of one machine.
type RecordMeta struct {
	Pipeline     string          `json:"pipeline"`
	Stage        string          `json:"stage"`
	Kind         string          `json:"kind"`
	KindVersion  string          `json:"kind_version,omitempty"`
	FerryVersion string          `json:"ferry_version,omitempty"`
	Params       json.RawMessage `json:"params"`
	Inputs       []Input         `json:"inputs,omitempty"`
	Started      time.Time       `json:"started"`
	Finished     time.Time       `json:"finished"`
}

// IsObject says whether rec is kept as a store record object: every
// record but an import's (which names this machine's files).
func IsObject(rec *Record) bool { return rec.Kind != "import" && len(rec.Sources) == 0 }

// ToStoreRecord is rec as a store record (outputs in path order).
func ToStoreRecord(rec *Record) (*store.Record, error) {
	meta, err := json.Marshal(RecordMeta{
		Pipeline: rec.Pipeline, Stage: rec.Stage, Kind: rec.Kind, KindVersion: rec.KindVersion,
		FerryVersion: rec.FerryVersion, Params: rec.Params, Inputs: rec.Inputs,
		Started: rec.Started, Finished: rec.Finished,
	})
	if err != nil {
		return nil, err
	}
	outs := make([]store.Output, len(rec.Outputs))
	for i, o := range rec.Outputs {
		outs[i] = store.Output{Path: o.Path, Digest: o.Digest, Size: o.Size}
	}
	sort.Slice(outs, func(i, j int) bool { return outs[i].Path < outs[j].Path })
	return &store.Record{Key: rec.Key, Outputs: outs, Host: rec.Host, Meta: meta}, nil
}

// FromStoreRecord is the record a store record holds; where names the
// store for errors.
func FromStoreRecord(where string, srec *store.Record) (*Record, error) {
	var meta RecordMeta
	if len(srec.Meta) > 0 {
		if err := json.Unmarshal(srec.Meta, &meta); err != nil {
			return nil, errkind.Errorf(errkind.VerifyFailed, "%s: record %s: its meta: %v", where, srec.Key, err)
		}
	}
	rec := &Record{
		Key: srec.Key, Pipeline: meta.Pipeline, Stage: meta.Stage, Kind: meta.Kind,
		FerryVersion: meta.FerryVersion, KindVersion: meta.KindVersion,
		Params: meta.Params, Inputs: meta.Inputs, Host: srec.Host,
		Outputs: make([]Output, len(srec.Outputs)),
		Started: meta.Started, Finished: meta.Finished, Status: StatusComplete,
	}
	for i, o := range srec.Outputs {
		if err := checkRelPath(o.Path); err != nil {
			return nil, errkind.Errorf(errkind.VerifyFailed, "%s: record %s: %v", where, srec.Key, err)
		}
		if err := o.Digest.Validate(); err != nil || o.Size < 0 {
			return nil, errkind.Errorf(errkind.VerifyFailed, "%s: record %s: output %q: bad digest or size %d", where, srec.Key, o.Path, o.Size)
		}
		rec.Outputs[i] = Output{Path: o.Path, Digest: o.Digest, Size: o.Size}
	}
	return rec, nil
}

// StageRef is the ref naming the latest record of a pipeline's stage.
func StageRef(pipeline, stage string) string { return "pipelines/" + pipeline + "/" + stage }

// openObjects opens the store of package store on root; with existing, a
// directory that is not one yet is none (nil), and nothing is made.
func openObjects(root string, existing bool) (*store.Store, error) {
	if existing {
		if _, err := os.Stat(filepath.Join(root, "format")); errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
	}
	b, err := local.New(root)
	if err != nil {
		return nil, err
	}
	// No probe: a directory honours its conditions (flock and link(2)),
	// and one that is not shared needs none checked at every open.
	// Its blobs are read here only by verify, several at a time: small
	// reads, one in flight per blob, bound its memory (8 × 2 × 5 MiB).
	s, err := store.Open(context.Background(), b, store.Options{
		CacheDir: filepath.Join(root, "fetch"), SkipProbe: true, Existing: existing,
		PartSize: store.MinPartSize, Parallel: 1,
		// Its leases (gc's) are taken under the directory's lock: one a
		// killed gc held is this directory's to take over at once.
		ResumeLeases: true,
	})
	if errors.Is(err, store.ErrNoStore) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", root, err)
	}
	return s, nil
}

// Objects is the store of package store on this directory (nil for a
// store read before it was ever opened for writing).
func (s *Store) Objects() *store.Store { return s.objs }

// loadObjects reads the record objects and the stages' refs into m. A
// stage pointer manifest.json holds (an import's) stands over a ref.
func loadObjects(ctx context.Context, objs *store.Store, m *Manifest) error {
	var keys []string
	if err := objs.Records(ctx, func(k string) error { keys = append(keys, k); return nil }); err != nil {
		return err
	}
	for _, k := range keys {
		srec, err := objs.Record(ctx, k)
		if errors.Is(err, store.ErrNotFound) {
			continue // dropped meanwhile
		}
		if err != nil {
			return err
		}
		rec, err := FromStoreRecord(objs.String(), srec)
		if err != nil {
			return err
		}
		m.Records[k] = rec
	}
	var refs []string
	if err := objs.Backend().List(ctx, "refs/pipelines/", func(in store.Info) error {
		refs = append(refs, strings.TrimPrefix(in.Key, "refs/"))
		return nil
	}); err != nil {
		return err
	}
	for _, name := range refs {
		p, stage, ok := strings.Cut(strings.TrimPrefix(name, "pipelines/"), "/")
		if !ok {
			continue
		}
		ref, err := objs.GetRef(ctx, name)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if m.Records[ref.Value] == nil {
			continue // a ref to a record dropped by gc: no pointer
		}
		if _, ok := m.Pipelines[p][stage]; ok {
			continue
		}
		if m.Pipelines[p] == nil {
			m.Pipelines[p] = map[string]string{}
		}
		m.Pipelines[p][stage] = ref.Value
	}
	return nil
}

// putObject writes rec as a record object, create-only: when its key is
// already there (another pipeline, a copy) the record that stands is
// returned.
func (s *Store) putObject(ctx context.Context, rec *Record) (*Record, error) {
	srec, err := ToStoreRecord(rec)
	if err != nil {
		return nil, err
	}
	old, err := s.objs.CommitRecord(ctx, srec)
	if errors.Is(err, store.ErrRecordExists) {
		c, cerr := FromStoreRecord(s.objs.String(), old)
		if cerr != nil {
			return nil, cerr
		}
		return c, nil
	}
	if err != nil {
		return nil, err
	}
	c := *rec
	c.Host = old.Host
	return &c, nil
}

// pointRef points the stage's ref at key.
func (s *Store) pointRef(ctx context.Context, pipeline, stage, key string) error {
	return s.objs.PointRef(ctx, StageRef(pipeline, stage), key)
}

// dropObjects deletes the record objects keys (pruned records; their blobs
// go with the gc after).
func (s *Store) dropObjects(keys []string) error {
	if s.objs == nil {
		return nil
	}
	ctx := context.Background()
	for _, k := range keys {
		if err := s.objs.DropRecord(ctx, k); err != nil {
			return fmt.Errorf("store %s: dropping record %s: %w", s.Root, k, err)
		}
	}
	return nil
}

// StampPlaced stamps the blobs the records name that have no stamp: blobs
// `ferry store copy` placed (store/local checked each one's SHA-256 as it
// stored it). It saves the manifest if it stamped any; the caller holds
// the lock.
func (s *Store) StampPlaced() (int, error) {
	n := 0
	for _, r := range s.Records() {
		for _, o := range r.Outputs {
			if _, ok := s.stamp(o.Digest); ok {
				continue
			}
			fi, err := os.Lstat(s.BlobPath(o.Digest))
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return n, err
			}
			if !fi.Mode().IsRegular() || fi.Size() != o.Size {
				continue // not whole: CheckBlob says so
			}
			s.setStamp(o.Digest, StampOf(fi))
			n++
		}
	}
	if n == 0 {
		return 0, nil
	}
	return n, s.Save()
}

// SetHost names this machine in the record objects it writes (ferry's
// --machine; default the host name).
func (s *Store) SetHost(host string) {
	if host == "" || s.objs == nil {
		return
	}
	s.mu.Lock()
	s.objs = s.objs.WithHost(host)
	s.mu.Unlock()
}

// objects is the store of package store on this directory, made now if
// the directory was read before it was ever opened for writing. The
// caller holds the lock.
func (s *Store) objects() (*store.Store, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.objs == nil {
		objs, err := openObjects(s.Root, false)
		if err != nil {
			return nil, err
		}
		s.objs = objs
	}
	return s.objs, nil
}
