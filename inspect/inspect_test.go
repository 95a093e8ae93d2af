package inspect

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/hashing"
)

// A read that fails while hashing (a shard shortened after its header was
// checked) names the shard, the tensor and the absolute offset.
func TestInspectHashReadError(t *testing.T) {
	rows := []Row{
		{Name: "a", Shard: "model-00001-of-00002.safetensors", Offset: 96, Bytes: 64},
		{Name: "b", Shard: "model-00002-of-00002.safetensors", Offset: 128, Bytes: 1 << 21},
	}
	short := io.NewSectionReader(bytes.NewReader(make([]byte, 1000)), 0, 1<<21)
	ok := io.NewSectionReader(bytes.NewReader(make([]byte, 64)), 0, 64)
	_, err := hashing.Sections(context.Background(), []hashing.Section{ok, short}, 2, nil)
	err = rowHashError(rows, err)
	want := `shard model-00002-of-00002.safetensors: tensor "b" at offset 1128: unexpected EOF`
	if err == nil || err.Error() != want || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("error %v, want %q", err, want)
	}
}

// An mmproj shows as one: the summary carries its clip.* description
// (--json: summary.mmproj), the text says kind mmproj and that an MTP head
// does not apply; a text GGUF has neither.
func TestInspectMMProj(t *testing.T) {
	rep, err := Path(context.Background(), "../gguf/convert/testdata/qwen35vl/mmproj-base-F16.gguf", Options{})
	if err != nil {
		t.Fatal(err)
	}
	mm := rep.Summary.MMProj
	if mm == nil || mm.Projector != "qwen3vl_merger" || !mm.Vision || mm.Blocks != 2 || mm.EmbeddingLength != 64 || mm.ImageSize != 128 || rep.Summary.Architecture != "clip" || rep.Summary.Parameters != 301120 {
		t.Fatalf("summary %+v, mmproj %+v", rep.Summary, mm)
	}
	var b bytes.Buffer
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kind          mmproj (vision tower): qwen3vl_merger projector, 2 blocks of 64", "mtp           not applicable"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, b.String())
		}
	}
	text, err := Path(context.Background(), "../gguf/testdata/qwen3-base-Q8_0.gguf", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if text.Summary.MMProj != nil {
		t.Errorf("a text GGUF described as an mmproj: %+v", text.Summary.MMProj)
	}
}
