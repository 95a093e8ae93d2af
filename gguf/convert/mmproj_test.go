package convert

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/gguf/internal/ggufcheck"
	"github.com/ferry-llm/ferry/safetensors"
)

// testdata/qwen35vl (PROVENANCE.md there): the reference's --mmproj output
// and the 33 model.visual.* tensors of its base, byte for byte.
const (
	vlDir        = "testdata/qwen35vl/base"
	vlMMProj     = "testdata/qwen35vl/mmproj-base-F16.gguf"
	vlMMProjSHA  = "1ae17f7fb2f614b7a2cea8736b593356e2ef96560fc6dd0d710a3352d2bbcd72"
	vlMMProjSize = 617472
)

func fileSHA(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func planMMProj(t *testing.T, dir string, opts Options) (*safetensors.Checkpoint, *Plan, error) {
	t.Helper()
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	opts.MMProj = true
	p, err := NewPlan(ck, opts)
	return ck, p, err
}

// TestGoldenMMProjF16: ferry's --mmproj of the reference base is
// convert_hf_to_gguf.py --mmproj --outtype f16's file byte for byte, with
// every worker count.
func TestGoldenMMProjF16(t *testing.T) {
	if got := fileSHA(t, vlMMProj); got != vlMMProjSHA {
		t.Fatalf("testdata golden sha256 %s, PROVENANCE says %s", got, vlMMProjSHA)
	}
	want, err := os.ReadFile(vlMMProj)
	if err != nil {
		t.Fatal(err)
	}
	for _, jobs := range []int{1, 3} {
		_, p, err := planMMProj(t, vlDir, Options{OutType: OutF16})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Warnings) != 0 {
			t.Errorf("warnings %q", p.Warnings)
		}
		out := filepath.Join(t.TempDir(), "mmproj.gguf")
		if err := Write(context.Background(), p, out, WriteOptions{Jobs: jobs, ChunkElems: 1000}); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			i := 0
			for i < len(got) && i < len(want) && got[i] == want[i] {
				i++
			}
			t.Fatalf("jobs %d: %d bytes, reference %d; first difference at byte %d", jobs, len(got), len(want), i)
		}
		if err := ggufcheck.Check(out); err != nil {
			t.Fatalf("gguf-parser-go cross-check: %v", err)
		}
		if name := p.DefaultFileName(false); name != "mmproj-Base-F16.gguf" {
			t.Errorf("default file name %q", name)
		}
	}
}
