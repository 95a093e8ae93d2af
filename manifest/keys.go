package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Stage keys. A record is keyed by what decides its bytes and by nothing
// else, so that every machine and every release that makes the same bytes
// shares it: the stage's kind, that kind's output-format version (bumped
// only when the kind's output bytes change), its parameters in one
// canonical form and its inputs' digests. Never ferry's release version,
// never a path on one machine.

// CanonicalJSON returns the JSON value b in the one form keys hash: objects
// with their keys sorted at every level, no insignificant space, numbers as
// written (decoded as json.Number, so no integer loses precision). Two
// encodings of the same value, say a struct whose fields were reordered or
// that gained an omitempty field at its zero value, give the same bytes.
func CanonicalJSON(b []byte) (json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("canonical JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("canonical JSON: data after the value")
	}
	return json.Marshal(v) // encoding/json sorts map keys
}

// StageKey is the key of the record of a stage of kind (at format version
// kindVersion) run with params over inputs (their OutputsDigest, in the
// stage's input order). params need not be canonical: they are made so.
func StageKey(kind, kindVersion string, params json.RawMessage, inputs []Digest) (string, error) {
	p, err := CanonicalJSON(params)
	if err != nil {
		return "", err
	}
	if inputs == nil {
		inputs = []Digest{}
	}
	return keyOf(struct {
		Kind        string          `json:"kind"`
		KindVersion string          `json:"kind_version"`
		Params      json.RawMessage `json:"params"`
		Inputs      []Digest        `json:"inputs"`
	}{kind, kindVersion, p, inputs})
}

// SourceKey is the key of the record of a stage that reads files outside
// the store (an import): it is known only once the stage has read them,
// from what it made (outputs: their OutputsDigest) and its params without
// the path (SourceParams). Two imports of the same files from two
// directories, or on two machines, share it.
func SourceKey(kind, kindVersion string, params json.RawMessage, outputs Digest) (string, error) {
	p, err := SourceParams(params)
	if err != nil {
		return "", err
	}
	return keyOf(struct {
		Kind        string          `json:"kind"`
		KindVersion string          `json:"kind_version"`
		Params      json.RawMessage `json:"params"`
		Outputs     Digest          `json:"outputs"`
	}{kind, kindVersion, p, outputs})
}

// SourcePathParam is the parameter that says where a stage reading files
// outside the store reads them (import's path): a fact of one machine,
// neither in its key nor in its record's params (its Sources say where it
// read, on this machine).
const SourcePathParam = "path"

// SourceParams is params (a JSON object) without SourcePathParam, in
// canonical form: what a source-keyed stage's key and record hold.
func SourceParams(params json.RawMessage) (json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(params, &m); err != nil {
		return nil, fmt.Errorf("source params: %w", err)
	}
	delete(m, SourcePathParam)
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return CanonicalJSON(b)
}

func keyOf(payload any) (string, error) {
	b, err := json.Marshal(payload)
	if err != nil {
		return "", err
	}
	return DigestOf(b).Hex(), nil
}
