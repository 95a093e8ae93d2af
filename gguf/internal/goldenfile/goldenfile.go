// Package goldenfile reduces a GGUF file to what golden tests compare:
// every KV (key, value type, value) in order, every tensor (name, type,
// dims, offset, sha256 of its bytes) in order, and the whole file's size
// and sha256. The reference tools' outputs are kept in testdata as these
// dumps (a few KiB of JSON instead of the file), and ferry's outputs are
// dumped the same way and compared. It is imported only by tests.
package goldenfile

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/ferry-llm/ferry/gguf"
)

// File is a dumped GGUF file.
type File struct {
	Source  string   `json:"source"`
	Size    int64    `json:"size"`
	SHA256  string   `json:"sha256"`
	KVs     []KV     `json:"kvs"`
	Tensors []Tensor `json:"tensors"`
}

// KV is one metadata pair; Value is compact JSON (arrays as {elem, values}).
type KV struct {
	Key   string          `json:"key"`
	Type  string          `json:"type"`
	Value json.RawMessage `json:"value"`
}

// Tensor is one tensor info and the sha256 of its data.
type Tensor struct {
	Name   string   `json:"name"`
	Type   string   `json:"type"`
	Dims   []uint64 `json:"dims"`
	Offset uint64   `json:"offset"`
	SHA256 string   `json:"sha256"`
}

func kvJSON(kv gguf.KV) (json.RawMessage, error) {
	v := kv.Value
	if a, ok := v.(gguf.Array); ok {
		v = map[string]any{"elem": a.Elem.String(), "values": a.Values}
	}
	return json.Marshal(v)
}

// Dump reads the GGUF file at path; source says where it came from.
func Dump(path, source string) (*File, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	g := &File{Source: source, Size: f.Size}
	for _, kv := range f.KVs {
		v, err := kvJSON(kv)
		if err != nil {
			return nil, fmt.Errorf("%s: KV %s: %w", path, kv.Key, err)
		}
		g.KVs = append(g.KVs, KV{kv.Key, kv.Type.String(), v})
	}
	for _, ti := range f.Tensors {
		h := sha256.New()
		if _, err := io.Copy(h, f.Section(ti)); err != nil {
			return nil, fmt.Errorf("%s: tensor %s: %w", path, ti.Name, err)
		}
		g.Tensors = append(g.Tensors, Tensor{ti.Name, ti.Type.String(), ti.Dims, ti.Offset, hex.EncodeToString(h.Sum(nil))})
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	h := sha256.New()
	if _, err := io.Copy(h, fh); err != nil {
		return nil, err
	}
	g.SHA256 = hex.EncodeToString(h.Sum(nil))
	return g, nil
}

// Save writes g as indented JSON.
func Save(path string, g *File) error {
	b, err := json.MarshalIndent(g, "", " ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// Load reads a dump written by Save, its KV values compacted.
func Load(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var g File
	if err := json.Unmarshal(b, &g); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for i := range g.KVs { // MarshalIndent indented the raw values
		var c bytes.Buffer
		if err := json.Compact(&c, g.KVs[i].Value); err != nil {
			return nil, fmt.Errorf("%s: KV %s: %w", path, g.KVs[i].Key, err)
		}
		g.KVs[i].Value = c.Bytes()
	}
	return &g, nil
}
