package quant_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf/internal/goldenfile"
	"github.com/ferry-llm/ferry/gguf/quant"
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

// TestMixGolden: for every llama-quantize output kept in testdata/golden,
// Mix on the F16 input's tensors, taken in LoaderLess order, gives the
// output's tensor table: the same names in the same order, the same dims,
// the same types, and general.file_type is the file type asked for.
func TestMixGolden(t *testing.T) {
	q8 := quant.Q8_0
	variants := map[string]quant.MixOptions{
		"":                         {},
		"-pure":                    {Pure: true},
		"-out_q8_0-embd_q8_0":      {OutputType: &q8, TokenEmbdType: &q8},
		"-attnv_q8_0-ffndown_q5_k": {TensorTypes: []quant.TensorType{{Pattern: "attn_v", Type: quant.Q8_0}, {Pattern: "ffn_down", Type: quant.Q5_K}}},
	}
	n := 0
	for model, names := range Goldens {
		in, err := goldenfile.Load(filepath.Join("testdata", "golden", model+"-base-F16.json"))
		if err != nil {
			t.Fatal(err)
		}
		m, err := quant.ModelFromKV(goldenKV(t, in))
		if err != nil {
			t.Fatal(err)
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
		for _, name := range names {
			if name == "base-F16" {
				continue
			}
			ftName, variant, _ := strings.Cut(strings.TrimPrefix(name, "base-"), "-")
			if variant != "" {
				variant = "-" + variant
			}
			opts, ok := variants[variant]
			if !ok {
				t.Fatalf("%s: no options known for variant %q", name, variant)
			}
			t.Run(model+"/"+name, func(t *testing.T) {
				n++
				f, ok := quant.ParseFileType(ftName)
				if !ok {
					t.Fatalf("file type %q", ftName)
				}
				out, err := goldenfile.Load(filepath.Join("testdata", "golden", model+"-"+name+".json"))
				if err != nil {
					t.Fatal(err)
				}
				ft, _ := goldenKV(t, out)("general.file_type")
				if ft != uint32(f) {
					t.Errorf("general.file_type %v, want %d", ft, f)
				}
				types, err := quant.Mix(f, m, src, opts)
				if err != nil {
					t.Fatal(err)
				}
				var got, want []string
				for i, s := range src {
					got = append(got, fmt.Sprintf("%s %s %v", s.Name, types[i], s.Dims))
				}
				for _, ti := range out.Tensors {
					want = append(want, fmt.Sprintf("%s %s %v", ti.Name, ti.Type, ti.Dims))
				}
				if !slices.Equal(got, want) {
					t.Errorf("tensor table differs from llama-quantize's:\n%s", lineDiff(want, got))
				}
			})
		}
	}
	if n == 0 {
		t.Fatal("no golden checked")
	}
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
