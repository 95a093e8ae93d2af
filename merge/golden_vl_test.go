package merge

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
)

// The vision-language layout (model.language_model.*, model.visual.*,
// mtp.*): ferry's merge of the reference DoRA adapter equals PEFT's, tensor
// for tensor (the sha256 of each of PEFT's 89 tensors,
// testdata/reference/qwen35vl), the vision tower passes through unchanged,
// and the MTP head PEFT drops is kept as the base has it.
func TestGoldenPEFTVisionLanguage(t *testing.T) {
	const base = "../testdata/models/qwen35vl-tiny/base"
	out := filepath.Join(t.TempDir(), "merged")
	runMerge(t, base, "testdata/reference/qwen35vl/adapters/dora", out, PlanOptions{}, 2)
	got, err := safetensors.OpenDir(out)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	b, err := safetensors.OpenDir(base)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	sums := peftSums(t, "testdata/reference/qwen35vl/merged_dora.tensors.sha256")
	peft := map[string]bool{}
	for name, want := range sums {
		peft[name] = true
		info, data := readTensor(t, got, name)
		h := sha256.Sum256(data)
		if hex.EncodeToString(h[:]) != want.sum || fmt.Sprint(info.DType) != want.dtype || fmt.Sprint(info.Shape) != want.shape {
			t.Errorf("%s: %s %v sha256 %x; PEFT's %s %s %s", name, info.DType, info.Shape, h[:6], want.dtype, want.shape, want.sum[:12])
		}
	}
	if len(peft) != 89 {
		t.Fatalf("%d PEFT tensors listed, want 89", len(peft))
	}
	visual, mtp := 0, 0
	for _, l := range got.Tensors() {
		name := l.Info.Name
		if peft[name] {
			continue
		}
		if !strings.HasPrefix(name, "mtp.") {
			t.Errorf("%s: neither PEFT's nor the MTP head", name)
			continue
		}
		mtp++
		_, a := readTensor(t, b, name)
		_, c := readTensor(t, got, name)
		if string(a) != string(c) {
			t.Errorf("%s: the MTP head changed", name)
		}
	}
	for name := range peft {
		if strings.HasPrefix(name, "model.visual.") {
			visual++
			_, a := readTensor(t, b, name)
			_, c := readTensor(t, got, name)
			if string(a) != string(c) {
				t.Errorf("%s: the vision tower changed", name)
			}
		}
	}
	if visual != 33 || mtp != 15 {
		t.Errorf("%d vision tensors, %d MTP tensors; want 33 and 15", visual, mtp)
	}
}
