package safetensors

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/tensor"
)

// TestResumeWriter: a stream writer resumed at any byte of the bodies
// (tensor boundaries, inside a tensor, around a zero-size tensor, the end)
// ends with the bytes Create writes; a resume inside the header is refused.
func TestResumeWriter(t *testing.T) {
	specs := []TensorSpec{
		{Name: "a", DType: tensor.F32, Shape: []int64{3, 5}},
		{Name: "empty", DType: tensor.BF16, Shape: []int64{0}},
		{Name: "b", DType: tensor.BF16, Shape: []int64{7}},
	}
	md := map[string]string{"format": "pt"}
	body := make([]byte, 3*5*4+7*2)
	for i := range body {
		body[i] = byte(i * 7)
	}
	p := filepath.Join(t.TempDir(), "m.safetensors")
	w, err := Create(p, md, specs)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(body)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(p)
	hdr := int64(len(want) - len(body))
	for _, cut := range []int64{0, hdr, hdr + 1, hdr + 60, hdr + 61, int64(len(want))} {
		var dst bytes.Buffer
		dst.Write(want[:cut])
		w, err := ResumeWriter(&dst, "m.safetensors", md, specs, cut)
		if err != nil {
			t.Fatalf("resume at %d: %v", cut, err)
		}
		from := max(cut-hdr, 0)
		if _, err := w.Write(body[from:]); err != nil {
			t.Fatalf("resume at %d: %v", cut, err)
		}
		if err := w.Close(); err != nil {
			t.Fatalf("resume at %d: close: %v", cut, err)
		}
		if !bytes.Equal(dst.Bytes(), want) {
			t.Errorf("resume at %d: bytes differ from Create's", cut)
		}
	}
	if _, err := ResumeWriter(&bytes.Buffer{}, "m.safetensors", md, specs, hdr-1); !errors.Is(err, ErrWriteSize) {
		t.Errorf("resume inside the header: %v", err)
	}
	// A stream missing bytes is not complete.
	w2, _ := NewWriter(&bytes.Buffer{}, "m.safetensors", md, specs)
	w2.Write(body[:10])
	if err := w2.Close(); !errors.Is(err, ErrWriteSize) {
		t.Errorf("short stream closed: %v", err)
	}
}
