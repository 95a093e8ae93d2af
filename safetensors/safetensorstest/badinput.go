// Package safetensorstest builds safetensors files and checkpoint
// directories for tests: valid ones, and a table of bad inputs that every
// layer (the parser, the checkpoint opener, the CLI) must reject with the
// right sentinel error, naming the offending file, without touching it.
package safetensorstest

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// WriteRaw writes a safetensors file from a literal JSON header (padded
// with spaces to a multiple of 8) and data bytes, with no validation.
func WriteRaw(path, header string, data []byte) error {
	for len(header)%8 != 0 {
		header += " "
	}
	b := make([]byte, 8, 8+len(header)+len(data))
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	b = append(append(b, header...), data...)
	return os.WriteFile(path, b, 0o644)
}

// Fill is deterministic tensor content: byte i of tensor name is a hash of
// both, so tensors differ and a misplaced byte shows.
func Fill(name string, size int64) []byte {
	h := sha256.Sum256([]byte(name))
	b := make([]byte, size)
	for i := range b {
		b[i] = h[i%len(h)] ^ byte(i/len(h))
	}
	return b
}

// WriteFile writes a valid safetensors file through the package writer,
// tensors in the given order, with Fill content.
func WriteFile(path string, specs ...safetensors.TensorSpec) error {
	w, err := safetensors.Create(path, map[string]string{"format": "pt"}, specs)
	if err != nil {
		return err
	}
	for _, s := range specs {
		if _, err := w.Write(Fill(s.Name, s.Size())); err != nil {
			w.Abort()
			return err
		}
	}
	return w.Close()
}

// Spec is shorthand for a TensorSpec.
func Spec(name string, d tensor.DType, shape ...int64) safetensors.TensorSpec {
	return safetensors.TensorSpec{Name: name, DType: d, Shape: shape}
}

// Shards is the layout of the valid two-shard checkpoint WriteCheckpoint
// makes.
var Shards = []safetensors.ShardFile{
	{Name: safetensors.ShardName(1, 2), Tensors: []safetensors.TensorSpec{
		Spec("model.embed_tokens.weight", tensor.BF16, 8, 4),
		Spec("model.layers.0.input_layernorm.weight", tensor.BF16, 4),
	}},
	{Name: safetensors.ShardName(2, 2), Tensors: []safetensors.TensorSpec{
		Spec("model.layers.0.mlp.down_proj.weight", tensor.BF16, 4, 4),
		Spec("model.norm.weight", tensor.BF16, 4),
	}},
}

// WriteCheckpoint writes a valid two-shard checkpoint (Shards) with an
// index and a config.json into dir.
func WriteCheckpoint(dir string) error {
	sw, err := safetensors.CreateShardedFiles(dir, map[string]string{"format": "pt"}, Shards, nil)
	if err != nil {
		return err
	}
	for _, f := range Shards {
		for _, s := range f.Tensors {
			if err := sw.WriteTensor(s.Name, strings.NewReader(string(Fill(s.Name, s.Size())))); err != nil {
				sw.Abort()
				return err
			}
		}
	}
	if err := sw.Close(); err != nil {
		return err
	}
	cfg := `{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1, "hidden_size": 4}`
	return os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644)
}

// EditIndex rewrites dir's index through edit.
func EditIndex(dir string, edit func(weightMap map[string]string)) error {
	p := filepath.Join(dir, safetensors.IndexName)
	var idx struct {
		Metadata  map[string]any    `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		return err
	}
	edit(idx.WeightMap)
	if b, err = json.MarshalIndent(idx, "", "  "); err != nil {
		return err
	}
	return os.WriteFile(p, b, 0o644)
}

// BadCase is one bad input.
type BadCase struct {
	Name string
	// Want is the sentinel errors.Is must find.
	Want error
	// Blame is the base name of the file the error message must name.
	Blame string
	// Dir says Build returns a checkpoint directory (else a file).
	Dir bool
	// Build creates the input under root (a fresh directory) and returns
	// the path to open.
	Build func(root string) (string, error)
}

func rawCase(name string, want error, header string, data []byte) BadCase {
	file := strings.ReplaceAll(name, " ", "-") + ".safetensors"
	return BadCase{Name: name, Want: want, Blame: file, Build: func(root string) (string, error) {
		p := filepath.Join(root, file)
		return p, WriteRaw(p, header, data)
	}}
}

func fileCase(name string, want error, build func(p string) error) BadCase {
	file := strings.ReplaceAll(name, " ", "-") + ".safetensors"
	return BadCase{Name: name, Want: want, Blame: file, Build: func(root string) (string, error) {
		p := filepath.Join(root, file)
		return p, build(p)
	}}
}

func dirCase(name string, want error, blame string, edit func(root, dir string) error) BadCase {
	return BadCase{Name: name, Want: want, Blame: blame, Dir: true, Build: func(root string) (string, error) {
		dir := filepath.Join(root, "ckpt")
		if err := WriteCheckpoint(dir); err != nil {
			return "", err
		}
		return dir, edit(root, dir)
	}}
}

func valid(p string) error {
	return WriteFile(p, Spec("a", tensor.F32, 4), Spec("b", tensor.F32, 2, 2))
}

// BadCases is the bad-input table.
func BadCases() []BadCase {
	shard1, shard2 := Shards[0].Name, Shards[1].Name
	return []BadCase{
		fileCase("truncated file", safetensors.ErrTruncated, func(p string) error {
			if err := valid(p); err != nil {
				return err
			}
			st, err := os.Stat(p)
			if err != nil {
				return err
			}
			return os.Truncate(p, st.Size()-5)
		}),
		fileCase("shorter than the length prefix", safetensors.ErrTruncated, func(p string) error {
			return os.WriteFile(p, []byte{16, 0, 0}, 0o644)
		}),
		fileCase("header length larger than the file", safetensors.ErrHeaderLength, func(p string) error {
			b := make([]byte, 8, 32)
			binary.LittleEndian.PutUint64(b, 1000)
			return os.WriteFile(p, append(b, `{"a":{"dtype":"U8","shape":[1]`...), 0o644)
		}),
		fileCase("header length over 100 MB", safetensors.ErrHeaderTooLarge, func(p string) error {
			b := make([]byte, 8, 16)
			binary.LittleEndian.PutUint64(b, safetensors.MaxHeaderSize+1)
			return os.WriteFile(p, append(b, "{}      "...), 0o644)
		}),
		rawCase("invalid JSON", safetensors.ErrInvalidHeader, `{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},`, make([]byte, 4)),
		rawCase("duplicate tensor name", safetensors.ErrDuplicateTensor,
			`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, make([]byte, 8)),
		rawCase("overlapping offsets", safetensors.ErrOverlap,
			`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, make([]byte, 12)),
		rawCase("gap between tensors", safetensors.ErrGap,
			`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}`, make([]byte, 12)),
		rawCase("bytes not shape times dtype", safetensors.ErrSizeMismatch,
			`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, make([]byte, 8)),
		rawCase("unknown dtype", safetensors.ErrUnknownDType,
			`{"a":{"dtype":"F17","shape":[2],"data_offsets":[0,4]}}`, make([]byte, 4)),
		fileCase("trailing bytes", safetensors.ErrTrailingBytes, func(p string) error {
			if err := valid(p); err != nil {
				return err
			}
			f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			if _, err := f.Write([]byte("junk")); err != nil {
				f.Close()
				return err
			}
			return f.Close()
		}),
		dirCase("weight_map entry with ..", safetensors.ErrOutsideDir, safetensors.IndexName, func(root, dir string) error {
			return EditIndex(dir, func(wm map[string]string) { wm["model.norm.weight"] = "../" + shard2 })
		}),
		dirCase("weight_map entry absolute", safetensors.ErrOutsideDir, safetensors.IndexName, func(root, dir string) error {
			return EditIndex(dir, func(wm map[string]string) { wm["model.norm.weight"] = filepath.Join(root, shard2) })
		}),
		dirCase("missing shard", safetensors.ErrMissingShard, shard2, func(root, dir string) error {
			return os.Remove(filepath.Join(dir, shard2))
		}),
		dirCase("tensor missing from its shard", safetensors.ErrMissingTensor, shard2, func(root, dir string) error {
			return EditIndex(dir, func(wm map[string]string) { wm["model.layers.0.mlp.up_proj.weight"] = shard2 })
		}),
		dirCase("tensor in two shards", safetensors.ErrTensorTwice, shard2, func(root, dir string) error {
			specs := append([]safetensors.TensorSpec{Shards[0].Tensors[1]}, Shards[1].Tensors...)
			return WriteFile(filepath.Join(dir, shard2), specs...)
		}),
		dirCase("tensor not in the index", safetensors.ErrUnindexedTensor, shard2, func(root, dir string) error {
			specs := append([]safetensors.TensorSpec{Spec("extra.weight", tensor.BF16, 2)}, Shards[1].Tensors...)
			return WriteFile(filepath.Join(dir, shard2), specs...)
		}),
		dirCase("stray shard", safetensors.ErrStrayShard, safetensors.ShardName(3, 3), func(root, dir string) error {
			return WriteFile(filepath.Join(dir, safetensors.ShardName(3, 3)), Spec("x", tensor.U8, 1))
		}),
		dirCase("symlinked shard leaving the directory", safetensors.ErrSymlinkOutside, shard2, func(root, dir string) error {
			outside := filepath.Join(root, "elsewhere")
			if err := os.Mkdir(outside, 0o755); err != nil {
				return err
			}
			target := filepath.Join(outside, shard2)
			if err := os.Rename(filepath.Join(dir, shard2), target); err != nil {
				return err
			}
			return os.Symlink(filepath.Join("..", "elsewhere", shard2), filepath.Join(dir, shard2))
		}),
		dirCase("shard named but absent from the index", safetensors.ErrMissingShard, safetensors.IndexName, func(root, dir string) error {
			// The index and the disk agree on one file, model-00001-of-00002,
			// whose name says a second shard exists.
			if err := os.Remove(filepath.Join(dir, shard2)); err != nil {
				return err
			}
			return EditIndex(dir, func(wm map[string]string) {
				for k, v := range wm {
					if v == shard2 {
						delete(wm, k)
					}
				}
			})
		}),
		dirCase("invalid index JSON", safetensors.ErrInvalidIndex, safetensors.IndexName, func(root, dir string) error {
			return os.WriteFile(filepath.Join(dir, safetensors.IndexName), []byte(`{"weight_map": {"a": 1}}`), 0o644)
		}),
		dirCase("bad shard inside a checkpoint", safetensors.ErrTrailingBytes, shard1, func(root, dir string) error {
			f, err := os.OpenFile(filepath.Join(dir, shard1), os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			f.Write([]byte{0})
			return f.Close()
		}),
	}
}

// Snapshot records every file and symlink under root (content digest,
// mode, link target), to check that nothing was modified.
func Snapshot(root string) (map[string]string, error) {
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[p] = "link " + t
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h := sha256.Sum256(b)
			out[p] = fmt.Sprintf("%v %d %s %d", info.Mode(), info.Size(), hex.EncodeToString(h[:]), info.ModTime().UnixNano())
		case d.IsDir():
			out[p] = "dir " + info.Mode().String()
		}
		return nil
	})
	return out, err
}
