package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/errkind"
)

// MaxRecordSize bounds a record object before it is read into memory.
const MaxRecordSize = 16 << 20

// Output is one file a stage produced.
type Output struct {
	Path   string        `json:"path"` // relative, slash-separated
	Digest digest.Digest `json:"digest"`
	Size   int64         `json:"size"`
}

// Record is the commit point of a stage: written once, after every blob it
// names is stored, and never changed. What the pipeline keeps beside the
// outputs (kind, parameters, inputs, times) is Meta, opaque to the store.
type Record struct {
	Key     string          `json:"key"`
	Outputs []Output        `json:"outputs"`
	Host    string          `json:"host,omitempty"` // the machine that made it
	Meta    json.RawMessage `json:"meta,omitempty"`
}

// ErrRecordExists reports a record key already written by another run
// (maybe on another machine); the record that stands is returned beside it.
var ErrRecordExists = errors.New("store: record exists")

func recordKey(key string) string { return "records/" + key + ".json" }

// CommitRecord writes r create-only, after checking that every output blob
// is stored with its size (ErrBlobMissing otherwise: a record never names
// a blob the store lacks). When the key is already recorded, the record
// that stands is returned with ErrRecordExists: content addressing makes
// its outputs the same bytes, and a stage that ran twice keeps the first.
func (s *Store) CommitRecord(ctx context.Context, r *Record) (*Record, error) {
	if err := checkName("record", r.Key); err != nil {
		return nil, err
	}
	for _, o := range r.Outputs {
		size, ok, err := s.HasBlob(ctx, o.Digest)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("%s: record %s: output %s (blob %s): %w", s.b, r.Key, o.Path, o.Digest.Short(), ErrBlobMissing)
		}
		if size != o.Size {
			return nil, fmt.Errorf("%s: record %s: output %s: blob %s holds %d bytes, not %d: %w", s.b, r.Key, o.Path, o.Digest.Short(), size, o.Size, ErrDigestMismatch)
		}
	}
	if r.Host == "" {
		r.Host = s.opt.Host
	}
	body, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	_, err = s.b.Put(ctx, recordKey(r.Key), append(body, '\n'), PutOptions{IfNoneMatch: true})
	if errors.Is(err, ErrPrecondition) {
		old, gerr := s.Record(ctx, r.Key)
		if gerr != nil {
			return nil, gerr
		}
		return old, fmt.Errorf("%s: record %s (made on %s): %w", s.b, r.Key, old.Host, ErrRecordExists)
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Record reads the record key; ErrNotFound when there is none.
func (s *Store) Record(ctx context.Context, key string) (*Record, error) {
	if err := checkName("record", key); err != nil {
		return nil, err
	}
	body, _, err := s.b.Get(ctx, recordKey(key), MaxRecordSize)
	if err != nil {
		return nil, err
	}
	r, err := decodeRecord(body)
	if err != nil {
		return nil, errkind.Errorf(errkind.VerifyFailed, "%s: record %s: %w", s.b, key, err)
	}
	if r.Key != key {
		return nil, errkind.Errorf(errkind.VerifyFailed, "%s: record %s holds key %q", s.b, key, r.Key)
	}
	return r, nil
}

func decodeRecord(body []byte) (*Record, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var r Record
	if err := dec.Decode(&r); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the record")
	}
	for _, o := range r.Outputs {
		if err := o.Digest.Validate(); err != nil {
			return nil, err
		}
		if o.Size < 0 || o.Path == "" {
			return nil, fmt.Errorf("output %q: bad path or size %d", o.Path, o.Size)
		}
	}
	return &r, nil
}

// Records calls fn with the key of every record.
func (s *Store) Records(ctx context.Context, fn func(key string) error) error {
	return s.b.List(ctx, "records/", func(in Info) error {
		k, ok := strings.CutSuffix(strings.TrimPrefix(in.Key, "records/"), ".json")
		if !ok {
			return nil
		}
		return fn(k)
	})
}

// Ref is a ref's value and the ETag of the object holding it, what SetRef
// takes to replace exactly that value.
type Ref struct {
	Name  string
	Value string
	ETag  string
}

// ErrRefConflict reports a ref changed (or created) by someone else since
// it was read: read it again and decide again.
var ErrRefConflict = errkind.New(errkind.Retryable, "store: ref changed concurrently")

func refKey(name string) string { return "refs/" + name }

// GetRef reads the ref name; ErrNotFound when it does not exist.
func (s *Store) GetRef(ctx context.Context, name string) (Ref, error) {
	if err := checkName("ref", name); err != nil {
		return Ref{}, err
	}
	body, in, err := s.b.Get(ctx, refKey(name), 64<<10)
	if err != nil {
		return Ref{}, err
	}
	return Ref{Name: name, Value: strings.TrimSuffix(string(body), "\n"), ETag: in.ETag}, nil
}

// ErrRefBroken reports a ref that does not name a record the store holds:
// its value is no record key, or that record is gone. The next run of its
// stage points it again.
var ErrRefBroken = errkind.New(errkind.VerifyFailed, "store: ref names no record the store holds")

// RefRecord reads the record ref names: ErrRefBroken when its value is no
// record key or the store lacks that record.
func (s *Store) RefRecord(ctx context.Context, ref Ref) (*Record, error) {
	if checkName("record", ref.Value) != nil {
		return nil, fmt.Errorf("%s: ref %s holds %q, not a record key: %w", s.b, ref.Name, ref.Value, ErrRefBroken)
	}
	r, err := s.Record(ctx, ref.Value)
	if errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("%s: ref %s names record %s, which is not in the store: %w", s.b, ref.Name, ref.Value, ErrRefBroken)
	}
	return r, err
}

// SetRef sets the ref name to value by compare-and-swap: prev nil creates
// it (ErrRefConflict if it exists), else it replaces exactly the value prev
// read (ErrRefConflict if it changed since).
func (s *Store) SetRef(ctx context.Context, name, value string, prev *Ref) (Ref, error) {
	if err := checkName("ref", name); err != nil {
		return Ref{}, err
	}
	if strings.ContainsAny(value, "\n") {
		return Ref{}, fmt.Errorf("store: ref %s: value has a newline", name)
	}
	opt := PutOptions{IfNoneMatch: true}
	if prev != nil {
		opt = PutOptions{IfMatch: prev.ETag}
	}
	in, err := s.b.Put(ctx, refKey(name), []byte(value+"\n"), opt)
	if errors.Is(err, ErrPrecondition) {
		return Ref{}, fmt.Errorf("%s: ref %s: %w", s.b, name, ErrRefConflict)
	}
	if err != nil {
		return Ref{}, err
	}
	return Ref{Name: name, Value: value, ETag: in.ETag}, nil
}

// PointRef sets the ref name to value whatever it held, by compare and
// swap (read again after a race, a few times).
func (s *Store) PointRef(ctx context.Context, name, value string) error {
	for range 8 {
		prev, err := s.GetRef(ctx, name)
		var p *Ref
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			return err
		case prev.Value == value:
			return nil
		default:
			p = &prev
		}
		_, err = s.SetRef(ctx, name, value, p)
		if !errors.Is(err, ErrRefConflict) {
			return err
		}
	}
	return fmt.Errorf("%s: ref %s: changed by others at every try", s.b, name)
}

// DropRecord deletes the record key: what a store's owner prunes (a result
// no pipeline stage points at any more). Its blobs stay until gc.
func (s *Store) DropRecord(ctx context.Context, key string) error {
	if err := checkName("record", key); err != nil {
		return err
	}
	return s.b.Delete(ctx, recordKey(key), "")
}
