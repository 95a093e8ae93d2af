package mlxpack

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

func testShard(t *testing.T) *outShard {
	t.Helper()
	sh, err := layoutShard("model.safetensors", mlxShardMetadata, []safetensors.TensorSpec{
		{Name: "a", DType: tensor.U8, Shape: []int64{5}},
		{Name: "b", DType: tensor.U8, Shape: []int64{3}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return &sh
}

// TestShardFileStream: a streamed shard is checked byte for byte against
// its layout: bytes past the end are refused, and one left short is not
// committed (nothing under its name, no temp file left).
func TestShardFileStream(t *testing.T) {
	sh := testShard(t)
	body := []byte("abcdefgh")
	for _, tc := range []struct {
		name    string
		writes  [][]byte
		wantErr bool
	}{
		{"whole", [][]byte{body[:2], body[2:7], body[7:]}, false},
		{"short", [][]byte{body[:7]}, true},
		{"past the end", [][]byte{body, []byte("x")}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, sh.name)
			w, err := replaceShard(path, sh)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range tc.writes {
				if _, err = w.Write(p); err != nil {
					break
				}
			}
			if err == nil {
				err = w.Close()
			} else {
				w.Abort()
			}
			if tc.wantErr {
				if !errors.Is(err, safetensors.ErrWriteSize) {
					t.Fatalf("err = %v, want ErrWriteSize", err)
				}
				if ents, _ := os.ReadDir(dir); len(ents) != 0 {
					t.Fatalf("left %v", ents)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if want := append(append([]byte{}, sh.hdr...), body...); !bytes.Equal(got, want) {
				t.Fatalf("file %q, want %q", got, want)
			}
			same, err := holdsShard(path, sh, func(w2 io.Writer) error {
				_, err := w2.Write(body)
				return err
			})
			if err != nil || !same {
				t.Fatalf("holdsShard = %v, %v; want true", same, err)
			}
		})
	}
}

// TestShardFileAt: bodies written at offsets land where the layout puts
// them; a write outside its tensor is refused; a resume accepts only a
// file of the planned size and header.
func TestShardFileAt(t *testing.T) {
	sh := testShard(t)
	path := filepath.Join(t.TempDir(), sh.name)
	w, err := createShard(path, sh)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.writeTensorAt(1, 0, []byte("fgh")); err != nil {
		t.Fatal(err)
	}
	if err := w.writeTensorAt(0, 0, []byte("abcde")); err != nil {
		t.Fatal(err)
	}
	if err := w.writeTensorAt(1, 1, []byte("xyz")); !errors.Is(err, safetensors.ErrWriteSize) {
		t.Fatalf("write past tensor b: err = %v, want ErrWriteSize", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 3)
	info, _ := f.Tensor("b")
	if _, err := f.Section(info).ReadAt(b, 0); err != nil || string(b) != "fgh" {
		t.Fatalf("tensor b = %q, %v", b, err)
	}
	f.Close()
	r, err := resumeShard(path, sh)
	if err != nil {
		t.Fatalf("resume of a matching file: %v", err)
	}
	r.Abort()
	other, err := layoutShard(sh.name, nil, sh.specs) // same size, other header
	if err != nil {
		t.Fatal(err)
	}
	if len(other.hdr) == len(sh.hdr) {
		t.Fatal("test wants headers of different lengths")
	}
	if r, err := resumeShard(path, &other); err == nil {
		r.Abort()
		t.Fatal("resume accepted a file of another layout")
	}
}

// TestSplitShards: mlx-lm's make_shards and save_model names, including
// the empty first shard a first tensor over the limit leaves.
func TestSplitShards(t *testing.T) {
	spec := func(name string, n int64) safetensors.TensorSpec {
		return safetensors.TensorSpec{Name: name, DType: tensor.U8, Shape: []int64{n}}
	}
	for _, tc := range []struct {
		name  string
		specs []safetensors.TensorSpec
		limit int64
		want  [][]string
	}{
		{"one", []safetensors.TensorSpec{spec("a", 4), spec("b", 4)}, 8, [][]string{{"model.safetensors", "a", "b"}}},
		{"split", []safetensors.TensorSpec{spec("a", 4), spec("b", 4), spec("c", 1)}, 6,
			[][]string{{"model-00001-of-00002.safetensors", "a"}, {"model-00002-of-00002.safetensors", "b", "c"}}},
		{"first over", []safetensors.TensorSpec{spec("a", 9), spec("b", 1)}, 6,
			[][]string{{"model-00001-of-00003.safetensors"}, {"model-00002-of-00003.safetensors", "a"}, {"model-00003-of-00003.safetensors", "b"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shards, err := splitShards(tc.specs, tc.limit)
			if err != nil {
				t.Fatal(err)
			}
			var got [][]string
			for _, s := range shards {
				g := []string{s.name}
				for _, sp := range s.specs {
					g = append(g, sp.Name)
				}
				got = append(got, g)
				if !strings.Contains(string(s.hdr), `"__metadata__":{"format":"mlx"}`) {
					t.Errorf("%s: header %q without mlx-lm's metadata", s.name, s.hdr)
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestRewriteNameClashRefusedAtPlan: a source holding an MLX-named tensor
// beside the packed module that --rewrite renames to that name is bad
// input found by the plan, before anything is written (it was found only
// when the shard was written).
func TestRewriteNameClashRefusedAtPlan(t *testing.T) {
	c := testmodel.CompressedQwen3(1)
	var scale *testmodel.CompressedTensor
	for _, ct := range c.Tensors {
		if strings.HasSuffix(ct.Name, sfxScale) {
			scale = ct
			break
		}
	}
	mod := strings.TrimSuffix(scale.Name, sfxScale)
	c.Tensors = append(c.Tensors, &testmodel.CompressedTensor{Name: mod + ".scales", DType: scale.DType, Shape: scale.Shape, Data: scale.Data})
	src := writeFixture(t, c)
	_, err := PlanRepack(src, Options{Rewrite: true})
	if !errors.Is(err, ErrInconsistent) || !strings.Contains(err.Error(), mod+".scales") {
		t.Fatalf("err = %v, want ErrInconsistent naming %s.scales", err, mod)
	}
}
