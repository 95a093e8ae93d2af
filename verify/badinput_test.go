package verify

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/safetensors"
)

type badInputErr interface{ BadInput() bool }

// TestBadInput: inputs that cannot be checked give a clear error naming the
// file (and tensor/offset where the parser knows one), marked BadInput
// (exit 2), and never a report.
func TestBadInput(t *testing.T) {
	tiny := func(t *testing.T) string { return gen(t, testmodel.Qwen35Options{}) }
	cases := []struct {
		name  string
		setup func(t *testing.T) string
		is    error  // errors.Is target, if any
		text  string // must appear in the message
	}{
		{"missing path", func(t *testing.T) string { return filepath.Join(t.TempDir(), "nope") }, fs.ErrNotExist, "nope"},
		{"not a model: text file", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "README.md")
			os.WriteFile(p, []byte("# hello\n"), 0o644)
			return p
		}, ErrNotModel, "README.md"},
		{"not a model: empty directory", func(t *testing.T) string { return t.TempDir() }, safetensors.ErrNotCheckpoint, ""},
		{"truncated GGUF header", func(t *testing.T) string {
			head, err := os.ReadFile("testdata/reference/gguf/qwen35-base-F16.gguf.head")
			if err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(t.TempDir(), "cut.gguf")
			os.WriteFile(p, head[:5000], 0o644)
			return p
		}, nil, "cut.gguf"},
		{"GGUF header whose data is missing", func(t *testing.T) string {
			head, _ := os.ReadFile("testdata/reference/gguf/qwen35-base-F16.gguf.head")
			p := filepath.Join(t.TempDir(), "header-only.gguf")
			os.WriteFile(p, head, 0o644)
			return p
		}, gguf.ErrDataRange, "header-only.gguf"},
		{"GGUF nextn key of the wrong type", func(t *testing.T) string {
			return writeGGUF(t, ggufEdit{kvs: setKV("qwen35.nextn_predict_layers", gguf.Str("qwen35.nextn_predict_layers", "one"))})
		}, ErrBadMetadata, "qwen35.nextn_predict_layers"},
		{"GGUF without block_count", func(t *testing.T) string {
			return writeGGUF(t, ggufEdit{kvs: dropKV("qwen35.block_count")})
		}, ErrBadMetadata, "qwen35.block_count"},
		{"unreadable index: not JSON", func(t *testing.T) string {
			d := tiny(t)
			os.WriteFile(filepath.Join(d, safetensors.IndexName), []byte(`{"weight_map": {`), 0o644)
			return d
		}, safetensors.ErrInvalidIndex, safetensors.IndexName},
		{"index names a missing shard", func(t *testing.T) string {
			d := tiny(t)
			m, _ := filepath.Glob(filepath.Join(d, "model-*.safetensors"))
			os.Remove(m[len(m)-1])
			return d
		}, safetensors.ErrMissingShard, ".safetensors"},
		{"truncated shard header", func(t *testing.T) string {
			d := tiny(t)
			m, _ := filepath.Glob(filepath.Join(d, "model-*.safetensors"))
			os.Truncate(m[0], 100)
			return d
		}, nil, "model-00001-of-"},
		{"no config.json", func(t *testing.T) string {
			d := tiny(t)
			os.Remove(filepath.Join(d, "config.json"))
			return d
		}, ErrNoConfig, ""},
		{"config MTP count not a number", func(t *testing.T) string {
			return rewrite(t, tiny(t), nil, setKey("mtp_num_hidden_layers", "one"))
		}, ErrBadMetadata, "mtp_num_hidden_layers"},
		{"config without num_hidden_layers", func(t *testing.T) string {
			return rewrite(t, tiny(t), nil, delKey("num_hidden_layers"))
		}, ErrBadMetadata, "num_hidden_layers"},
		{"MLX quantization block not an object", func(t *testing.T) string {
			return rewrite(t, tiny(t), nil, setKey("quantization", 4))
		}, ErrBadMetadata, "quantization"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := c.setup(t)
			r, err := MTP(p, Options{})
			if err == nil {
				t.Fatalf("no error; report %s", describe(r))
			}
			if r != nil {
				t.Errorf("a report with the error")
			}
			var bi badInputErr
			if !errors.As(err, &bi) || !bi.BadInput() {
				t.Errorf("%v (%T) is not marked bad input", err, err)
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("%v is not %v", err, c.is)
			}
			if !strings.Contains(err.Error(), c.text) {
				t.Errorf("%q does not name %q", err, c.text)
			}
		})
	}
}

// TestInputsNotModified: verify opens everything read-only.
func TestInputsNotModified(t *testing.T) {
	dir := gen(t, testmodel.Qwen35Options{})
	before := snapshot(t, dir)
	for _, deep := range []bool{false, true} {
		if _, err := MTP(dir, Options{Deep: deep}); err != nil {
			t.Fatal(err)
		}
	}
	after := snapshot(t, dir)
	if len(before) != len(after) {
		t.Fatalf("files changed: %d → %d", len(before), len(after))
	}
	for k, v := range before {
		if !bytes.Equal(after[k], v) {
			t.Errorf("%s changed", k)
		}
	}
}

func snapshot(t *testing.T, dir string) map[string][]byte {
	out := map[string][]byte{}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = b
	}
	return out
}
