package quant_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf/quant"
)

// The schemas in testdata/snapshots are llama.cpp's own expectations for
// its type rules (tests/snapshots at 34af94c, see PROVENANCE.md there).
// llama.cpp's test-quant-type-selection reads each model's real tensor
// list from the header of a published GGUF, keeps the tensors llama-quantize
// may quantize, sorts them in loader order, and runs the rules for every
// file type; a schema lists, per file type, each tensor whose type is not
// the default. The test here cannot download those headers, so it rebuilds
// each model's quantizable tensors from the shape in the schema's header
// line plus what the model's architecture puts in a block (a schemaModel),
// and checks every tensor: listed ones have the listed type, the others
// the default, and every listed name exists. Every schema is rebuilt; for
// Nemotron-3-Nano the block pattern comes from the names the schema lists.

// schemaHeader is the schema's second line: "# n_embd=…, n_ff=…, …".
type schemaHeader struct {
	embd, ff, vocab, layers, head, headKV, expert uint64
}

type schemaSection struct {
	name   string // llama-quantize's file type name
	def    quant.Type
	expect map[string]quant.Type
}

func parseSchema(t *testing.T, path string) (schemaHeader, []schemaSection) {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	var h schemaHeader
	var secs []schemaSection
	sc := bufio.NewScanner(fh)
	for ln := 1; sc.Scan(); ln++ {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "# n_embd="):
			for _, kv := range strings.Split(strings.TrimPrefix(line, "# "), ", ") {
				k, v, _ := strings.Cut(kv, "=")
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					t.Fatalf("%s:%d: %q: %v", path, ln, kv, err)
				}
				*map[string]*uint64{"n_embd": &h.embd, "n_ff": &h.ff, "n_vocab": &h.vocab, "n_layer": &h.layers,
					"n_head": &h.head, "n_head_kv": &h.headKV, "n_expert": &h.expert}[k] = n
			}
		case line == "" || line[0] == '#':
		case line[0] == '[':
			name, def, ok := strings.Cut(strings.TrimPrefix(line, "["), "] ")
			if !ok {
				t.Fatalf("%s:%d: bad section %q", path, ln, line)
			}
			secs = append(secs, schemaSection{name: name, def: mustType(t, def), expect: map[string]quant.Type{}})
		default:
			i := strings.LastIndexByte(line, ' ')
			if i < 0 || len(secs) == 0 {
				t.Fatalf("%s:%d: bad line %q", path, ln, line)
			}
			secs[len(secs)-1].expect[line[:i]] = mustType(t, line[i+1:])
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if h.layers == 0 || len(secs) == 0 {
		t.Fatalf("%s: no header or no sections", path)
	}
	return h, secs
}

// tensorList collects a rebuilt model's tensors (all F32, as in
// llama.cpp's test).
type tensorList []quant.Source

func (l *tensorList) add(name string, dims ...uint64) {
	*l = append(*l, quant.Source{Name: name, Dims: dims, Type: quant.F32})
}

func (l *tensorList) blk(i int, name string, dims ...uint64) {
	l.add(fmt.Sprintf("blk.%d.%s.weight", i, name), dims...)
}

// attention adds a block's attention projections: n_head·hd query rows
// (twice that where the query carries its gate), kv_head·hd key and value
// rows.
func (l *tensorList) attention(h schemaHeader, i int, hd uint64, gatedQ bool) {
	q := h.head * hd
	if gatedQ {
		l.blk(i, "attn_q", h.embd, 2*q)
	} else {
		l.blk(i, "attn_q", h.embd, q)
	}
	l.blk(i, "attn_k", h.embd, h.headKV*hd)
	l.blk(i, "attn_v", h.embd, h.headKV*hd)
	l.blk(i, "attn_output", q, h.embd)
}

func (l *tensorList) denseFFN(h schemaHeader, i int) {
	l.blk(i, "ffn_gate", h.embd, h.ff)
	l.blk(i, "ffn_up", h.embd, h.ff)
	l.blk(i, "ffn_down", h.ff, h.embd)
}

// moeFFN adds the stacked experts (3-D) and, if shff > 0, a shared expert.
func (l *tensorList) moeFFN(h schemaHeader, i int, eff, shff uint64) {
	l.blk(i, "ffn_gate_exps", h.embd, eff, h.expert)
	l.blk(i, "ffn_up_exps", h.embd, eff, h.expert)
	l.blk(i, "ffn_down_exps", eff, h.embd, h.expert)
	if shff > 0 {
		l.blk(i, "ffn_gate_shexp", h.embd, shff)
		l.blk(i, "ffn_up_shexp", h.embd, shff)
		l.blk(i, "ffn_down_shexp", shff, h.embd)
	}
}

func (l *tensorList) embeddings(h schemaHeader, tied bool) {
	l.add("token_embd.weight", h.embd, h.vocab)
	if !tied {
		l.add("output.weight", h.embd, h.vocab)
	}
}

// gatedDeltaNet adds a Qwen3-Next/Qwen3.5 linear-attention block: nk key
// heads and nv value heads of 128, with beta and alpha as one ssm_ba
// (Qwen3-Next) or apart (Qwen3.5).
func (l *tensorList) gatedDeltaNet(h schemaHeader, i int, nk, nv uint64, splitBA bool) {
	const d = 128
	l.blk(i, "attn_qkv", h.embd, 2*nk*d+nv*d)
	l.blk(i, "attn_gate", h.embd, nv*d)
	if splitBA {
		l.blk(i, "ssm_beta", h.embd, nv)
		l.blk(i, "ssm_alpha", h.embd, nv)
	} else {
		l.blk(i, "ssm_ba", h.embd, 2*nv)
	}
	l.blk(i, "ssm_out", nv*d, h.embd)
}

// schemaModel rebuilds one schema's model. The per-architecture facts that
// the header line does not give (head size, tied embeddings, which blocks
// are full attention, expert sizes) are the published models' configs.
type schemaModel struct {
	arch  string
	build func(h schemaHeader) tensorList
	// blockKinds: build with nemotronH, from the kinds of blocks the
	// schema names.
	blockKinds bool
}

// nemotronH builds Nemotron-3-Nano from its block pattern: 'M' Mamba-2,
// '*' attention, 'E' MoE.
func nemotronH(h schemaHeader, pattern string) tensorList {
	var l tensorList
	l.embeddings(h, false)
	for i, k := range pattern {
		switch k {
		case 'M':
			l.blk(i, "ssm_in", h.embd, 2*4096+2*8*128+64)
			l.blk(i, "ssm_out", 4096, h.embd)
		case '*':
			l.blk(i, "attn_q", h.embd, 32*128)
			l.blk(i, "attn_k", h.embd, 2*128)
			l.blk(i, "attn_v", h.embd, 2*128)
			l.blk(i, "attn_output", 32*128, h.embd)
		case 'E':
			l.blk(i, "ffn_up_exps", h.embd, 1856, h.expert)
			l.blk(i, "ffn_down_exps", 1856, h.embd, h.expert)
			l.blk(i, "ffn_up_shexp", h.embd, 3712)
			l.blk(i, "ffn_down_shexp", 3712, h.embd)
		}
	}
	return l
}

// blockPattern reads each block's kind from the names a schema lists.
func blockPattern(t *testing.T, h schemaHeader, secs []schemaSection) string {
	p := make([]byte, h.layers)
	for _, sec := range secs {
		for name := range sec.expect {
			var i int
			var rest string
			if _, err := fmt.Sscanf(strings.Replace(name, ".", " ", 2), "blk %d %s", &i, &rest); err != nil {
				continue
			}
			k := byte('E')
			switch {
			case strings.HasPrefix(rest, "ssm_"):
				k = 'M'
			case strings.HasPrefix(rest, "attn_"):
				k = '*'
			}
			if p[i] != 0 && p[i] != k {
				t.Fatalf("block %d is both %c and %c", i, p[i], k)
			}
			p[i] = k
		}
	}
	if i := slices.Index(p, 0); i >= 0 {
		t.Fatalf("block %d: no tensor named", i)
	}
	return string(p)
}

// hybrid builds a Qwen3.5 / Qwen3-Next model: every fourth block is full
// (gated) attention, the rest Gated DeltaNet.
func hybrid(hd, nk, nv uint64, splitBA bool, ffn func(*tensorList, schemaHeader, int)) func(schemaHeader) tensorList {
	return func(h schemaHeader) tensorList {
		var l tensorList
		l.embeddings(h, false)
		for i := 0; i < int(h.layers); i++ {
			if (i+1)%4 == 0 {
				l.attention(h, i, hd, true)
			} else {
				l.gatedDeltaNet(h, i, nk, nv, splitBA)
			}
			ffn(&l, h, i)
		}
		return l
	}
}

// moeModel builds a model whose first dense blocks have a dense FFN and
// the rest experts of eff and a shared expert of shff; attn adds a block's
// attention.
func moeModel(dense int, eff, shff uint64, attn func(*tensorList, schemaHeader, int)) func(schemaHeader) tensorList {
	return func(h schemaHeader) tensorList {
		var l tensorList
		l.embeddings(h, false)
		for i := 0; i < int(h.layers); i++ {
			attn(&l, h, i)
			if i < dense {
				l.denseFFN(h, i)
			} else {
				l.moeFFN(h, i, eff, shff)
			}
		}
		return l
	}
}

func denseModel(hd uint64, tied bool) func(schemaHeader) tensorList {
	return func(h schemaHeader) tensorList {
		var l tensorList
		l.embeddings(h, tied)
		for i := 0; i < int(h.layers); i++ {
			l.attention(h, i, hd, false)
			l.denseFFN(h, i)
		}
		return l
	}
}

var schemaModels = map[string]schemaModel{
	"qwen3-0.6b.schema": {arch: "qwen3", build: denseModel(128, false)},
	"qwen3-14b.schema":  {arch: "qwen3", build: denseModel(128, false)},
	// The schema was made for the 70B model type: llama, 80 blocks, GQA.
	"meta-llama-3.1-70b-instruct.schema": {arch: "llama", build: denseModel(128, false)},
	"gemma-3-4b-it.schema":               {arch: "gemma3", build: denseModel(256, true)},
	"qwen3.6-27b.schema": {arch: "qwen35", build: hybrid(256, 16, 48, true, func(l *tensorList, h schemaHeader, i int) {
		l.denseFFN(h, i)
	})},
	"qwen3.5-397b-a17b.schema": {arch: "qwen35moe", build: hybrid(256, 16, 64, true, func(l *tensorList, h schemaHeader, i int) {
		l.moeFFN(h, i, 1024, 1024)
	})},
	"qwen3-coder-next.schema": {arch: "qwen3next", build: hybrid(256, 16, 32, false, func(l *tensorList, h schemaHeader, i int) {
		l.moeFFN(h, i, 512, 512)
	})},
	// n_embd 2880 is not a multiple of 256: the fallbacks.
	"gpt-oss-120b.schema": {arch: "gpt-oss", build: func(h schemaHeader) tensorList {
		var l tensorList
		h.vocab = 201088 // the header says 0: the GGUF's first split holds no token_embd
		l.embeddings(h, false)
		for i := 0; i < int(h.layers); i++ {
			l.attention(h, i, 64, false)
			l.moeFFN(h, i, h.ff, 0)
		}
		return l
	}},
	// DeepSeek-V3.1 (config.json): MLA with q_lora_rank 1536, kv_lora_rank
	// 512, 128+64 query/key dims and 128 value dims; blocks 0-2 dense
	// (first_k_dense_replace 3), then 256 experts of 2048 and one shared
	// expert. attn_k_b rows of 128 fall back.
	"deepseek-v3.1.schema": {arch: "deepseek2", build: moeModel(3, 2048, 2048, func(l *tensorList, h schemaHeader, i int) {
		l.blk(i, "attn_q_a", h.embd, 1536)
		l.blk(i, "attn_q_b", 1536, h.head*192)
		l.blk(i, "attn_kv_a_mqa", h.embd, 512+64)
		l.blk(i, "attn_k_b", 128, 512, h.head)
		l.blk(i, "attn_v_b", 512, 128, h.head)
		l.blk(i, "attn_output", h.head*128, h.embd)
	})},
	// GLM-4.6V (GLM-4.5-Air's text model): head size 128, block 0 dense
	// (first_k_dense_replace 1), then 128 experts of 1408 and a shared
	// expert of 1408; rows of 10944 and 1408 fall back.
	"glm-4.6v.schema": {arch: "glm4moe", build: moeModel(1, 1408, 1408, func(l *tensorList, h schemaHeader, i int) {
		l.attention(h, i, 128, false)
	})},
	// Step-3.5-Flash: head size 128 and a per-head attention gate in every
	// block, blocks 0-2 dense, then 288 experts of 1280 and a shared
	// expert of 1280.
	"step-3.5-flash.schema": {arch: "step35", build: moeModel(3, 1280, 1280, func(l *tensorList, h schemaHeader, i int) {
		l.attention(h, i, 128, false)
		l.blk(i, "attn_gate", h.embd, h.head)
	})},
	// Nemotron-3-Nano-30B-A3B: a hybrid whose blocks are each Mamba-2 (64
	// heads of 64), attention (32 heads of 128, 2 KV heads) or MoE (128
	// experts of 1856 and a shared expert of 3712, up and down only). The
	// block pattern (hybrid_override_pattern) is not in the header line;
	// it is taken from the tensor names the schema lists. n_head_kv is a
	// per-block array whose first value is 0, as the header says.
	"nemotron-nano-3-30b-a3b.schema": {arch: "nemotron_h_moe", blockKinds: true, build: nil},
}

// TestMixSnapshots checks Mix against every schema in testdata/snapshots,
// for every file type in it: the supported ones type-for-type, the others
// must be refused.
func TestMixSnapshots(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "snapshots", "*.schema"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no schemas: %v", err)
	}
	for _, path := range files {
		sm, ok := schemaModels[filepath.Base(path)]
		if !ok {
			t.Errorf("%s: no model description: add one to schemaModels", path)
			continue
		}
		t.Run(filepath.Base(path), func(t *testing.T) {
			h, secs := parseSchema(t, path)
			var ts tensorList
			if sm.blockKinds {
				p := blockPattern(t, h, secs)
				t.Logf("block pattern %s", p)
				ts = nemotronH(h, p)
			} else {
				ts = sm.build(h)
			}
			slices.SortFunc(ts, func(a, b quant.Source) int {
				if quant.LoaderLess(a.Name, b.Name) {
					return -1
				}
				return 1
			})
			m := quant.Model{Arch: sm.arch, NHead: uint32(h.head), NHeadKV: uint32(h.headKV), NExpert: uint32(h.expert), NLayerAll: uint32(h.layers)}
			checked := 0
			for _, sec := range secs {
				checked += checkSection(t, m, ts, sec)
			}
			t.Logf("%d tensors, %d file types checked, %d refused", len(ts), checked, len(secs)-checked)
			if checked < 16 {
				t.Errorf("only %d file types checked", checked)
			}
		})
	}
}

// checkSection checks one file type of a schema and says whether it was
// a supported one.
func checkSection(t *testing.T, m quant.Model, ts []quant.Source, sec schemaSection) int {
	f, err := quant.LookupFileType(sec.name)
	if errors.Is(err, quant.ErrUnsupportedFileType) {
		if _, err := quant.Mix(f, m, ts, quant.MixOptions{}); !errors.Is(err, quant.ErrUnsupportedFileType) {
			t.Errorf("[%s] Mix did not refuse: %v", sec.name, err)
		}
		return 0
	}
	if err != nil {
		t.Fatalf("[%s]: %v", sec.name, err)
	}
	if def, _ := f.Default(); def != sec.def {
		t.Errorf("[%s] default %s, schema says %s", sec.name, def, sec.def)
	}
	opts := quant.MixOptions{}
	if f == quant.FileQ2_K_S {
		if _, err := quant.Mix(f, m, ts, opts); !errors.Is(err, quant.ErrNeedsImatrix) {
			t.Errorf("[%s] without an importance matrix: %v", sec.name, err)
		}
		opts.HasImatrix = true // the schema's types are those with one
	}
	types, err := quant.Mix(f, m, ts, opts)
	if err != nil {
		t.Errorf("[%s] %v", sec.name, err)
		return 1
	}
	seen := 0
	bad := 0
	for i, s := range ts {
		want, listed := sec.expect[s.Name]
		if listed {
			seen++
		} else {
			want = sec.def
		}
		if types[i] != want {
			if bad++; bad <= 10 {
				t.Errorf("[%s] %s: %s, want %s", sec.name, s.Name, types[i], want)
			}
		}
	}
	if bad > 10 {
		t.Errorf("[%s] %d tensors differ in all", sec.name, bad)
	}
	if seen != len(sec.expect) {
		var missing []string
		for name := range sec.expect {
			if !slices.ContainsFunc(ts, func(s quant.Source) bool { return s.Name == name }) {
				missing = append(missing, name)
			}
		}
		slices.Sort(missing)
		t.Errorf("[%s] %d listed tensors not in the rebuilt model: %v", sec.name, len(missing), missing[:min(len(missing), 10)])
	}
	return 1
}
