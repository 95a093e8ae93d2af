package quantize

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/gguf/quant"
)

// The vision-language reference's K-quants (../shared/reference/qwen35vl:
// llama-quantize at 34af94c of the converter's base-F16.gguf, default
// threads, no imatrix; sha256 from its SHA256SUMS): ferry quantizing the
// Qwen3_5ForConditionalGeneration checkpoint straight from the safetensors
// writes each byte for byte.
func TestGoldenVisionLanguageQuants(t *testing.T) {
	for _, tc := range []struct {
		ft  quant.FileType
		sum string
	}{
		{quant.FileQ4_K_M, qwen35vlQ4KM},
		{quant.FileQ6_K, "3796d22a6e714cadcc93511bf16320f7ca28eeb16a95aa55b522926ce3d147d1"},
	} {
		t.Run(tc.ft.String(), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "base-"+tc.ft.String()+".gguf")
			quantizeSource(t, qwen35vlDir, out, Options{FileType: tc.ft})
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if s := sha256.Sum256(b); hex.EncodeToString(s[:]) != tc.sum {
				t.Errorf("sha256 %x, llama-quantize's %s", s, tc.sum)
			}
		})
	}
}
