package verify

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
)

// sparseCheckpoint copies the bundled qwen35 checkpoint's headers into a
// sparse checkpoint whose embed_tokens and lm_head have a vocabulary scaled
// so the tensors total about 50 GB (every other tensor, the mtp.* head
// included, unchanged), shards and index as in the original.
func sparseCheckpoint(b *testing.B) (string, int64) {
	b.Helper()
	ck, err := safetensors.OpenDir(bundledQwen35)
	if err != nil {
		b.Fatal(err)
	}
	defer ck.Close()
	const target = 50_000_000_000
	var rest int64
	big := func(n string) bool { return n == "model.embed_tokens.weight" || n == "lm_head.weight" }
	for _, l := range ck.Tensors() {
		if !big(l.Info.Name) {
			rest += l.Info.Size()
		}
	}
	vocab := (target - rest) / (2 * 2 * 256) // two BF16 [V, 256] matrices
	dir := b.TempDir()
	weightMap := map[string]string{}
	var total int64
	for _, sh := range ck.Shards {
		var specs []safetensors.TensorSpec
		for _, ti := range sh.Tensors {
			s := safetensors.TensorSpec{Name: ti.Name, DType: ti.DType, Shape: slices.Clone(ti.Shape)}
			if big(ti.Name) {
				s.Shape[0] = vocab
			}
			specs = append(specs, s)
			weightMap[ti.Name] = sh.Name
			total += s.Size()
		}
		hdr, infos, err := safetensors.EncodeHeader(sh.Metadata, specs)
		if err != nil {
			b.Fatal(err)
		}
		p := filepath.Join(dir, sh.Name)
		if err := os.WriteFile(p, hdr, 0o644); err != nil {
			b.Fatal(err)
		}
		size := int64(len(hdr))
		if len(infos) > 0 {
			size += infos[len(infos)-1].End
		}
		if err := os.Truncate(p, size); err != nil {
			b.Skipf("no sparse files here: %v", err)
		}
	}
	if err := safetensors.WriteIndex(dir, weightMap, total, nil); err != nil {
		b.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(bundledQwen35, "config.json"))
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		b.Fatal(err)
	}
	return dir, total
}

// BenchmarkMTPCheckpoint verifies the bundled 7 MB qwen35 checkpoint (the
// anchor) and a 50 GB sparse checkpoint with the same tensor table: headers
// and the index only, so the time must not grow with the weights.
func BenchmarkMTPCheckpoint(b *testing.B) {
	big, total := sparseCheckpoint(b)
	for _, bc := range []struct {
		name, path string
		bytes      int64
	}{{"size=7MB", bundledQwen35, 7_373_232}, {"size=50GB", big, total}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				r, err := MTP(bc.path, Options{})
				if err != nil || r.Verdict != OK {
					b.Fatalf("%v %v", err, r)
				}
			}
			b.ReportMetric(float64(bc.bytes), "tensor-bytes")
		})
	}
}
