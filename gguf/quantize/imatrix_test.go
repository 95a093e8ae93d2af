package quantize

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf/imatrix"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/internal/errkind"
)

// imatrixGoldens are the llama-quantize outputs made with an importance
// matrix: `llama-quantize --imatrix imatrix.gguf ../gguf/base-F16.gguf
// base-imatrix-TYPE.gguf TYPE` (gguf/quant/testdata/logs/
// MODEL-quantize_imatrix_TYPE.log).
var imatrixGoldens = []struct{ model, ftype string }{
	{"qwen3", "Q2_K"}, {"qwen3", "Q3_K_M"}, {"qwen3", "Q4_K_M"}, {"qwen3", "Q5_K_S"}, {"qwen3", "Q6_K"},
	{"qwen35", "Q2_K"}, {"qwen35", "Q4_K_M"},
}

// matrixPath is the reference importance matrix of model in format ext
// (".gguf" or ".dat"), kept in gguf/imatrix/testdata.
func matrixPath(model, ext string) string {
	return filepath.Join("..", "imatrix", "testdata", model+"-imatrix"+ext)
}

func openMatrix(t testing.TB, path string) *imatrix.Matrix {
	t.Helper()
	m, err := imatrix.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Every imatrix golden, from the GGUF matrix and from the legacy .dat one
// (the same matrix, written by the other llama-imatrix output format):
// byte for byte llama-quantize's file. The goldens were made from the
// GGUF matrix; the .dat gives the same bytes on these dense models only
// because its ncall is 64, a power of two, so its values (sum/count)·64 / 64
// are sum/count exactly. On a MoE model's experts ncall is not a power of
// two and llama-quantize's files from the two formats differ
// (TestGoldenMoEImatrix, TestMoEImatrixFormatsDiffer). Both runs name the matrix
// "imatrix.gguf", as the golden's command line did: quantize.imatrix.file
// is the name as given, the one KV a run with "imatrix.dat" writes
// differently (TestImatrixFileKV).
func TestGoldenImatrix(t *testing.T) {
	for _, g := range imatrixGoldens {
		for _, ext := range []string{".gguf", ".dat"} {
			t.Run(g.model+"-"+g.ftype+ext, func(t *testing.T) {
				ft, err := ParseType(g.ftype)
				if err != nil {
					t.Fatal(err)
				}
				out := filepath.Join(t.TempDir(), "out.gguf")
				p, _ := goldenRun(t, input(g.model), out, filepath.Join(quantTestdata, "golden", g.model+"-imatrix-"+g.ftype+".json"),
					Options{FileType: ft, Imatrix: openMatrix(t, matrixPath(g.model, ext)), ImatrixFile: "imatrix.gguf"}, 1<<13)
				// The tensors quantized without weights are the ones
				// llama-quantize logged "did not find weights for".
				var unweighted []string
				for _, line := range strings.Split(quantizeLogText(t, g.model, "imatrix_"+g.ftype), "\n") {
					if n, ok := strings.CutPrefix(line, "====== llama_model_quantize_impl: did not find weights for "); ok {
						unweighted = append(unweighted, strings.TrimSpace(n))
					}
				}
				if strings.Join(p.Unweighted, " ") != strings.Join(unweighted, " ") || len(unweighted) == 0 {
					t.Errorf("unweighted %q, llama-quantize's log %q", p.Unweighted, unweighted)
				}
				requireMTP(t, out)
			})
		}
	}
}

// The matrix's name as given on the command line is quantize.imatrix.file
// (truncated to 127 bytes, as llama-quantize's KV override holds it);
// every other byte of the metadata comes from the matrix, the same from
// the .dat as from the GGUF.
func TestImatrixFileKV(t *testing.T) {
	in := input("qwen3")
	long := strings.Repeat("d/", 70) + "imatrix.dat"
	for _, c := range []struct{ given, want string }{
		{"imatrix.dat", "imatrix.dat"},
		{"../imatrix/imatrix.dat", "../imatrix/imatrix.dat"},
		{long, long[:127]},
	} {
		_, p, err := plan(t, in, Options{FileType: quant.FileQ4_K_M, Imatrix: openMatrix(t, matrixPath("qwen3", ".dat")), ImatrixFile: c.given})
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, kv := range p.KVs[len(p.KVs)-4:] {
			keys = append(keys, kv.Key)
			if kv.Key == imatrix.KeyFile && kv.Value != c.want {
				t.Errorf("%s: %q, want %q", kv.Key, kv.Value, c.want)
			}
		}
		if strings.Join(keys, " ") != "quantize.imatrix.file quantize.imatrix.dataset quantize.imatrix.entries_count quantize.imatrix.chunks_count" {
			t.Errorf("trailing keys %q", keys)
		}
	}
}

// Q2_K_S: refused without a matrix before anything is written, as
// llama-quantize refuses it ("this quantization requires an imatrix!");
// with the qwen35 matrix, which has no entries for the MTP block, refused
// too, naming every MTP tensor that would need one and the ways out; with
// --mtp-type Q8_0, or on qwen3 (every Q2_K tensor has an entry), planned.
func TestImatrixRequired(t *testing.T) {
	q8 := quant.Q8_0
	for _, c := range []struct {
		name  string
		model string
		o     Options
		err   error
		want  []string
	}{
		{"no matrix", "qwen3", Options{}, quant.ErrNeedsImatrix, []string{"needs --imatrix"}},
		{"empty after --include-weights", "qwen3", Options{Imatrix: openMatrix(t, matrixPath("qwen3", ".gguf")).Include([]string{"no.such"})}, quant.ErrNeedsImatrix, []string{"no entries left"}},
		{"MTP block without entries", "qwen35", Options{Imatrix: openMatrix(t, matrixPath("qwen35", ".gguf"))}, ErrImatrixMissing,
			[]string{"MTP/NextN tensors", "blk.4.nextn.eh_proj.weight", "blk.4.attn_q.weight", "--mtp-type Q8_0"}},
		{"--exclude-weights attn_q", "qwen3", Options{Imatrix: openMatrix(t, matrixPath("qwen3", ".gguf")).Exclude([]string{"attn_q"})}, ErrImatrixMissing,
			[]string{"blk.0.attn_q.weight, blk.1.attn_q.weight", "--tensor-type"}},
		{"MTP block at Q8_0", "qwen35", Options{Imatrix: openMatrix(t, matrixPath("qwen35", ".gguf")), MTPType: &q8}, nil, nil},
		{"every entry there", "qwen3", Options{Imatrix: openMatrix(t, matrixPath("qwen3", ".dat"))}, nil, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := c.o
			o.FileType = quant.FileQ2_K_S
			_, p, err := plan(t, input(c.model), o)
			if c.err == nil {
				if err != nil {
					t.Fatal(err)
				}
				if len(p.Unweighted) == 0 && c.model == "qwen35" {
					t.Error("no unweighted tensors")
				}
				return
			}
			if !errors.Is(err, c.err) || errkind.Of(err) != errkind.Usage {
				t.Fatalf("err %v (%s), want %v, a usage error", err, errkind.Of(err), c.err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
		})
	}
}

// quantizeLogText is llama-quantize's log gguf/quant/testdata/logs/
// MODEL-quantize_VARIANT.log.
func quantizeLogText(t *testing.T, model, variant string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(quantTestdata, "logs", model+"-quantize_"+variant+".log"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
