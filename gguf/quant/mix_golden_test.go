package quant_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf/internal/goldenfile"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/internal/testmodel"
)

// goldenKV is a lookup over a dump's KVs for quant.ModelFromKV, the values
// typed as package gguf reads them.
func goldenKV(t *testing.T, g *goldenfile.File) func(string) (any, bool) {
	return func(key string) (any, bool) {
		for _, kv := range g.KVs {
			if kv.Key != key {
				continue
			}
			var v any
			var err error
			switch kv.Type {
			case "STRING":
				var s string
				err = json.Unmarshal(kv.Value, &s)
				v = s
			case "UINT32":
				var n uint32
				err = json.Unmarshal(kv.Value, &n)
				v = n
			default:
				t.Fatalf("%s: KV %s of type %s: not read by the rules", g.Source, key, kv.Type)
			}
			if err != nil {
				t.Fatalf("%s: KV %s: %v", g.Source, key, err)
			}
			return v, true
		}
		return nil, false
	}
}

func mustType(t *testing.T, s string) quant.Type {
	t.Helper()
	ty, ok := quant.ParseType(s)
	if !ok {
		t.Fatalf("unknown type %q", s)
	}
	return ty
}

// goldenSources reads a dump's tensors as Mix's input, in LoaderLess
// order, and its model.
func goldenSources(t *testing.T, path string) (quant.Model, []quant.Source) {
	t.Helper()
	in, err := goldenfile.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := quant.ModelFromKV(goldenKV(t, in))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	src := make([]quant.Source, len(in.Tensors))
	for i, ti := range in.Tensors {
		src[i] = quant.Source{Name: ti.Name, Dims: ti.Dims, Type: mustType(t, ti.Type)}
	}
	slices.SortFunc(src, func(a, b quant.Source) int {
		if quant.LoaderLess(a.Name, b.Name) {
			return -1
		}
		return 1
	})
	return m, src
}

// mixCase is one llama-quantize run: its input dump, its file type and
// options, and either its output dump or its refusal.
type mixCase struct {
	name, in, out, refused string
	ftype                  string
	opts                   quant.MixOptions
}

// checkMixCase: Mix on the input's tensors, in LoaderLess order, gives
// the output's tensor table (the same names in the same order, the same
// dims and types, and general.file_type is the file type asked for), or
// refuses where llama-quantize refused, naming the same type.
func checkMixCase(t *testing.T, c mixCase) {
	m, src := goldenSources(t, c.in)
	f, ok := quant.ParseFileType(c.ftype)
	if !ok {
		t.Fatalf("file type %q", c.ftype)
	}
	types, err := quant.Mix(f, m, src, c.opts)
	if c.refused != "" {
		// "failed to quantize: no tensor type fallback is defined for type q8_0"
		typ := c.refused[strings.LastIndexByte(c.refused, ' ')+1:]
		if err == nil || !strings.Contains(err.Error(), "no tensor type fallback is defined for type "+mustType(t, typ).String()) {
			t.Errorf("llama-quantize refused (%s); Mix: %v", c.refused, err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	out, err := goldenfile.Load(c.out)
	if err != nil {
		t.Fatal(err)
	}
	if ft, _ := goldenKV(t, out)("general.file_type"); ft != uint32(f) {
		t.Errorf("general.file_type %v, want %d", ft, f)
	}
	var got, want []string
	for i, s := range src {
		got = append(got, fmt.Sprintf("%s %s %v", s.Name, types[i], ggmlDims(s.Dims)))
	}
	for _, ti := range out.Tensors {
		want = append(want, fmt.Sprintf("%s %s %v", ti.Name, ti.Type, ti.Dims))
	}
	if !slices.Equal(got, want) {
		t.Errorf("tensor table differs from llama-quantize's:\n%s", lineDiff(want, got))
	}
}

// TestMixGolden checks Mix against every llama-quantize run kept in
// testdata/golden: the reference set's (with the --pure, --output-tensor-type,
// --token-embedding-type and --tensor-type variants, and --imatrix), and golden/families
// (fallbacks, MoE, MTP, more layers, and the runs llama-quantize refused).
func TestMixGolden(t *testing.T) {
	q8 := quant.Q8_0
	variants := map[string]quant.MixOptions{
		"":                         {},
		"-pure":                    {Pure: true},
		"-out_q8_0-embd_q8_0":      {OutputType: &q8, TokenEmbdType: &q8},
		"-attnv_q8_0-ffndown_q5_k": {TensorTypes: []quant.TensorType{{Pattern: "attn_v", Type: quant.Q8_0}, {Pattern: "ffn_down", Type: quant.Q5_K}}},
	}
	dir := filepath.Join("testdata", "golden")
	var cases []mixCase
	for model, names := range Goldens {
		for _, name := range names {
			if name == "base-F16" {
				continue
			}
			ftype, variant, _ := strings.Cut(strings.TrimPrefix(name, "base-"), "-")
			if variant != "" {
				variant = "-" + variant
			}
			opts, ok := variants[variant]
			if !ok {
				t.Fatalf("%s: no options known for variant %q", name, variant)
			}
			cases = append(cases, mixCase{name: model + "/" + name, in: filepath.Join(dir, model+"-base-F16.json"),
				out: filepath.Join(dir, model+"-"+name+".json"), ftype: ftype, opts: opts})
		}
		for _, typ := range LegacyTypes {
			cases = append(cases, mixCase{name: model + "/" + typ, in: filepath.Join(dir, model+"-base-F16.json"),
				out: filepath.Join(dir, "families", model+"-"+typ+".json"), ftype: typ})
		}
	}
	// With an importance matrix the K-quant mixes are the same.
	for model, types := range ImatrixGoldens {
		for _, typ := range types {
			cases = append(cases, mixCase{name: model + "/imatrix-" + typ, in: filepath.Join(dir, model+"-base-F16.json"),
				out: filepath.Join(dir, model+"-imatrix-"+typ+".json"), ftype: typ, opts: quant.MixOptions{HasImatrix: true}})
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "families", "refused.json"))
	if err != nil {
		t.Fatal(err)
	}
	var refused map[string]string
	if err := json.Unmarshal(b, &refused); err != nil {
		t.Fatal(err)
	}
	for model := range testmodel.QuantizerFamilies {
		for _, typ := range FamilyTypes {
			cases = append(cases, mixCase{name: "families/" + model + "-" + typ, in: filepath.Join(dir, "families", model+"-F16.json"),
				out: filepath.Join(dir, "families", model+"-"+typ+".json"), refused: refused[model+"-"+typ], ftype: typ})
		}
	}
	nRefused := 0
	for _, c := range cases {
		if c.refused != "" {
			nRefused++
		}
		t.Run(c.name, func(t *testing.T) { checkMixCase(t, c) })
	}
	if len(cases) < 150 || nRefused != len(refused) {
		t.Errorf("%d runs checked, %d of them refusals (of %d)", len(cases), nRefused, len(refused))
	}
}

// ggmlDims is the dims llama-quantize writes: ggml_n_dims of them, so
// trailing 1s are dropped (a [64, 1] ffn_gate_inp_shexp comes out [64]).
func ggmlDims(d []uint64) []uint64 {
	n := len(d)
	for n > 1 && d[n-1] == 1 {
		n--
	}
	return d[:n]
}

// lineDiff lists the lines that differ, position by position.
func lineDiff(want, got []string) string {
	var b strings.Builder
	for i := 0; i < max(len(want), len(got)); i++ {
		w, g := "(none)", "(none)"
		if i < len(want) {
			w = want[i]
		}
		if i < len(got) {
			g = got[i]
		}
		if w != g {
			b.WriteString(strconv.Itoa(i) + ": want " + w + "\n   got  " + g + "\n")
		}
	}
	return b.String()
}

// logTensor starts a tensor's line in llama-quantize's log: the tensor
// count, its name and input type. "converting to TYPE" follows before the
// next tensor when it was converted; with an imatrix, other lines
// interleave with it.
var (
	logTensor  = regexp.MustCompile(`\[\s*\d+/\s*(\d+)\] (\S+)\s+- \[[^\]]*\], type =\s+(\S+), `)
	logConvert = regexp.MustCompile(`converting to (\S+) `)
)

// TestMixLogs checks Mix against the tensor lines of every llama-quantize
// log in testdata/logs (the reference set's runs: some, such as qwen35's
// Q4_K_S, Q5_K_S, Q3_K_S and Q3_K_L, stand for files not kept), with the
// flags of its command line.
func TestMixLogs(t *testing.T) {
	logs, err := filepath.Glob(filepath.Join("testdata", "logs", "*-quantize_*.log"))
	if err != nil || len(logs) < 20 {
		t.Fatalf("%d logs: %v", len(logs), err)
	}
	for _, path := range logs {
		t.Run(filepath.Base(path), func(t *testing.T) {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(string(b), "\n")
			_, cmd, ok := strings.Cut(lines[0], "llama-quantize ")
			if !ok {
				t.Fatalf("first line %q is not the command", lines[0])
			}
			args := strings.Fields(cmd)
			var o quant.MixOptions
			for len(args) > 3 && strings.HasPrefix(args[0], "--") {
				switch flag := args[0]; flag {
				case "--pure":
					o.Pure = true
					args = args[1:]
					continue
				case "--imatrix":
					o.HasImatrix = true
				case "--output-tensor-type":
					ty := mustType(t, args[1])
					o.OutputType = &ty
				case "--token-embedding-type":
					ty := mustType(t, args[1])
					o.TokenEmbdType = &ty
				case "--tensor-type":
					pat, typ, _ := strings.Cut(args[1], "=")
					o.TensorTypes = append(o.TensorTypes, quant.TensorType{Pattern: pat, Type: mustType(t, typ)})
				default:
					t.Fatalf("flag %s", flag)
				}
				args = args[2:]
			}
			if len(args) != 3 {
				t.Fatalf("command line %q", lines[0])
			}
			model := strings.Split(filepath.Base(path), "-")[0]
			m, src := goldenSources(t, filepath.Join("testdata", "golden", model+"-base-F16.json"))
			f, ok := quant.ParseFileType(args[2])
			if !ok {
				t.Fatalf("file type %q", args[2])
			}
			types, err := quant.Mix(f, m, src, o)
			if err != nil {
				t.Fatal(err)
			}
			var got, want []string
			for i, s := range src {
				got = append(got, s.Name+" "+strings.ToLower(types[i].String()))
			}
			text := string(b)
			at := logTensor.FindAllStringSubmatchIndex(text, -1)
			for i, a := range at {
				if n := text[a[2]:a[3]]; n != strconv.Itoa(len(src)) {
					t.Fatalf("log of %s tensors, input of %d", n, len(src))
				}
				typ, end := text[a[6]:a[7]], len(text)
				if i+1 < len(at) {
					end = at[i+1][0]
				}
				if c := logConvert.FindStringSubmatch(text[a[1]:end]); c != nil {
					typ = c[1]
				}
				want = append(want, text[a[4]:a[5]]+" "+strings.ToLower(typ))
			}
			if !slices.Equal(got, want) {
				t.Errorf("types differ from the log's:\n%s", lineDiff(want, got))
			}
		})
	}
}
