package inspect

import (
	"bytes"
	"context"
	"errors"
	"io"
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
