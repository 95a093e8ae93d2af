package quant

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestBlockOf(t *testing.T) {
	for _, tt := range []struct {
		name string
		n    int32
		ok   bool
	}{
		{"blk.7.attn_q.weight", 7, true},
		{"blk.12", 12, true},       // the trailing "." need not match
		{"blk.3x.weight", 3, true}, // nor anything after the digits
		{"blk. \t5.a", 5, true},    // %d skips white space
		{"blk.+4.a", 4, true},
		{"blk.-2.a", -2, true},
		{"blk.-.a", -1, false},
		{"blk.x.a", -1, false},
		{"blk.", -1, false},
		{"Blk.1.a", -1, false},
		{"output.weight", -1, false},
		{"nextn.blk.1.a", -1, false},
		{"blk.4294967297.a", 1, true},               // strtol, then the low 32 bits
		{"blk.99999999999.a", 1215752191, true},     // 99999999999 mod 2^32
		{"blk.99999999999999999999999.a", -1, true}, // LONG_MAX's low 32 bits
		{"blk.-99999999999999999999999.a", 0, true}, // LONG_MIN's
		{"blk.-9223372036854775808.a", 0, true},     // exactly LONG_MIN
		{"blk.18446744073709551616.a", -1, true},    // past uint64 too
		{"blk.00000000000000000000000000012.a", 12, true},
	} {
		n, ok := blockOf(tt.name)
		if n != tt.n || ok != tt.ok {
			t.Errorf("blockOf(%q) = %d %v, want %d %v", tt.name, n, ok, tt.n, tt.ok)
		}
	}
}

func TestLoaderLess(t *testing.T) {
	// llama-quantize's output order for a qwen3-like model.
	want := []string{
		"output.weight", "output_norm.weight", "token_embd.weight",
		"blk.0.attn_k.weight", "blk.0.attn_k_norm.weight", "blk.0.ffn_down.weight",
		"blk.2.attn_q.weight", "blk.2.ffn_up.weight",
		"blk.10.attn_k.weight", "blk.10.nextn.eh_proj.weight",
	}
	got := slices.Clone(want)
	slices.Reverse(got)
	slices.SortFunc(got, func(a, b string) int {
		if LoaderLess(a, b) {
			return -1
		}
		return 1
	})
	if !slices.Equal(got, want) {
		t.Errorf("order:\n%v\nwant\n%v", got, want)
	}
	if LoaderLess("a", "a") {
		t.Error("a < a")
	}
}

func TestAllowsQuantization(t *testing.T) {
	mat := []uint64{256, 4}
	for _, tt := range []struct {
		name string
		dims []uint64
		o    MixOptions
		want bool
	}{
		{"blk.0.attn_q.weight", mat, MixOptions{}, true},
		{"blk.0.attn_q.weight", []uint64{256}, MixOptions{}, false},
		{"blk.0.ffn_gate_inp_shexp.weight", []uint64{256, 1}, MixOptions{}, false}, // [n, 1] is 1-D
		{"blk.0.ffn_down_exps.weight", []uint64{256, 1, 4}, MixOptions{}, true},    // [n, 1, e] is 3-D
		{"blk.0.ssm_a", mat, MixOptions{}, false},
		{"blk.0.ssm_dt.bias", mat, MixOptions{}, false},
		{"abcde", mat, MixOptions{}, true}, // a 5-byte name passes the "weight" test
		{"abcd", mat, MixOptions{}, false},
		{"weight", mat, MixOptions{}, true},
		{"blk.0.attn_norm.weight", mat, MixOptions{}, false},
		{"blk.0.ffn_gate_inp.weight", mat, MixOptions{}, false},
		{"blk.0.ssm_conv1d.weight", mat, MixOptions{}, false},
		{"position_embd.weight", mat, MixOptions{}, false},
		{"v.position_embd.weight", mat, MixOptions{}, false},
		{"token_types.weight", mat, MixOptions{}, false},
		{"blk.0.time_mix_w1.weight", mat, MixOptions{}, false},
		{"output.weight", mat, MixOptions{}, true},
		{"output.weight", mat, MixOptions{LeaveOutput: true}, false},
		{"blk.3.nextn.eh_proj.weight", mat, MixOptions{}, true},
		{"blk.3.nextn.enorm.weight", mat, MixOptions{}, true}, // "enorm", not "_norm"
	} {
		if got := allowsQuantization(Source{Name: tt.name, Dims: tt.dims}, &tt.o); got != tt.want {
			t.Errorf("%s %v %+v: %v, want %v", tt.name, tt.dims, tt.o, got, tt.want)
		}
	}
}

// mixModel runs Mix on a dense model of n blocks with the given per-block
// tensors (short names, all [256·k, 256] F16) plus token_embd and, unless
// tied, output; it returns name → type.
func mixModel(t *testing.T, f FileType, m Model, block []string, tied bool, o MixOptions) map[string]Type {
	t.Helper()
	var ts []Source
	add := func(name string) { ts = append(ts, Source{Name: name, Dims: []uint64{512, 256}, Type: F16}) }
	if !tied {
		add("output.weight")
	}
	add("token_embd.weight")
	for i := 0; i < int(m.NLayerAll); i++ {
		for _, b := range block {
			add(fmt.Sprintf("blk.%d.%s.weight", i, b))
		}
	}
	slices.SortFunc(ts, func(a, b Source) int {
		if LoaderLess(a.Name, b.Name) {
			return -1
		}
		return 1
	})
	types, err := Mix(f, m, ts, o)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]Type{}
	for i, s := range ts {
		out[s.Name] = types[i]
	}
	return out
}

// layers lists the blocks of want's tensor that have type typ.
func layers(got map[string]Type, n int, tensor string, typ Type) []int {
	var l []int
	for i := 0; i < n; i++ {
		if got[fmt.Sprintf("blk.%d.%s.weight", i, tensor)] == typ {
			l = append(l, i)
		}
	}
	return l
}

// TestMixRules covers the paths no golden or schema here reaches: the
// falcon arch, 8-expert models, the 70B archs other than llama, and the
// options. With 16 blocks, n/16 = 1, n/8 = 2, 7n/8 = 14, and use_more_bits
// holds for blocks 0, 1, 4, 7, 10, 13, 14, 15.
func TestMixRules(t *testing.T) {
	more := []int{0, 1, 4, 7, 10, 13, 14, 15}
	falcon := Model{Arch: "falcon", NHead: 8, NHeadKV: 8, NLayerAll: 16}
	block := []string{"attn_qkv", "attn_output", "ffn_up", "ffn_down"}

	got := mixModel(t, FileQ4_K_M, falcon, block, false, MixOptions{})
	if got["output.weight"] != Q8_0 || got["token_embd.weight"] != Q4_K {
		t.Errorf("falcon Q4_K_M output %s token_embd %s, want Q8_0 Q4_K", got["output.weight"], got["token_embd.weight"])
	}
	if l := layers(got, 16, "ffn_down", Q6_K); !slices.Equal(l, []int{0}) {
		t.Errorf("falcon Q4_K_M ffn_down Q6_K in %v, want [0]", l)
	}
	if l := layers(got, 16, "ffn_down", Q5_K); !slices.Equal(l, more[1:]) {
		t.Errorf("falcon Q4_K_M ffn_down Q5_K in %v, want %v", l, more[1:])
	}
	if l := layers(got, 16, "attn_qkv", Q6_K); !slices.Equal(l, more) {
		t.Errorf("falcon Q4_K_M attn_qkv Q6_K in %v, want %v", l, more)
	}
	got = mixModel(t, FileQ3_K_M, falcon, block, false, MixOptions{})
	if l := layers(got, 16, "ffn_down", Q3_K); !slices.Equal(l, []int{2, 3, 5, 6, 8, 9, 11, 12}) {
		t.Errorf("falcon Q3_K_M ffn_down Q3_K in %v", l)
	}
	if l := layers(got, 16, "attn_output", Q3_K); len(l) != 16 {
		t.Errorf("falcon Q3_K_M attn_output Q3_K in %v, want all", l)
	}
	got = mixModel(t, FileQ3_K_L, falcon, block, false, MixOptions{})
	if l := layers(got, 16, "ffn_down", Q4_K); len(l) != 16 {
		t.Errorf("falcon Q3_K_L ffn_down Q4_K in %v, want all", l)
	}
	if l := layers(got, 16, "attn_output", Q4_K); len(l) != 16 {
		t.Errorf("falcon Q3_K_L attn_output Q4_K in %v, want all", l)
	}
	got = mixModel(t, FileQ4_K_S, falcon, block, false, MixOptions{})
	if l := layers(got, 16, "ffn_down", Q4_K); len(l) != 16 {
		t.Errorf("falcon Q4_K_S ffn_down Q4_K in %v, want all", l)
	}
	got = mixModel(t, FileQ6_K, falcon, block, true, MixOptions{})
	if got["token_embd.weight"] != Q8_0 {
		t.Errorf("falcon Q6_K tied token_embd %s, want Q8_0", got["token_embd.weight"])
	}

	// Mixtral-like: 8 experts, layers read from the names.
	mixtral := Model{Arch: "llama", NHead: 32, NHeadKV: 8, NExpert: 8, NLayerAll: 16}
	moe := []string{"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_exps", "ffn_down_exps", "ffn_up_exps"}
	for _, tt := range []struct {
		f          FileType
		attnOutput Type
	}{
		{FileQ2_K, Q5_K}, {FileQ3_K_S, Q5_K}, {FileQ3_K_M, Q5_K}, {FileQ3_K_L, Q3_K}, {FileQ4_K_S, Q5_K},
		{FileQ4_K_M, Q5_K}, {FileQ5_K_S, Q5_K}, {FileQ6_K, Q6_K}, {FileQ8_0, Q8_0},
	} {
		got := mixModel(t, tt.f, mixtral, moe, false, MixOptions{})
		if l := layers(got, 16, "attn_v", Q8_0); len(l) != 16 {
			t.Errorf("8 experts %s: attn_v Q8_0 in %v, want all", tt.f, l)
		}
		if l := layers(got, 16, "attn_k", Q8_0); len(l) != 16 {
			t.Errorf("8 experts %s: attn_k Q8_0 in %v, want all", tt.f, l)
		}
		if l := layers(got, 16, "attn_output", tt.attnOutput); len(l) != 16 {
			t.Errorf("8 experts %s: attn_output %s in %v, want all", tt.f, tt.attnOutput, l)
		}
	}
	got = mixModel(t, FileQ4_K_M, mixtral, moe, false, MixOptions{})
	if l := layers(got, 16, "ffn_down_exps", Q6_K); !slices.Equal(l, more) {
		t.Errorf("8 experts Q4_K_M ffn_down_exps Q6_K in %v, want %v", l, more)
	}

	// The 70B archs: attn_v Q3_K/Q4_K becomes Q5_K.
	for _, tt := range []struct {
		m    Model
		is70 bool
	}{
		{Model{Arch: "qwen2", NHead: 64, NHeadKV: 8, NLayerAll: 80}, true},
		{Model{Arch: "olmo", NHead: 64, NHeadKV: 64, NLayerAll: 80}, true},
		{Model{Arch: "deci", NHead: 64, NHeadKV: 8, NLayerAll: 80}, true},
		{Model{Arch: "jais2", NHead: 64, NHeadKV: 8, NLayerAll: 68}, true},
		{Model{Arch: "jais2", NHead: 64, NHeadKV: 8, NLayerAll: 80}, false},
		{Model{Arch: "llama", NHead: 64, NHeadKV: 64, NLayerAll: 80}, false}, // 65B
		{Model{Arch: "llama", NHead: 64, NHeadKV: 8, NLayerAll: 80, NExpert: 8}, false},
		{Model{Arch: "qwen3", NHead: 64, NHeadKV: 8, NLayerAll: 80}, false},
	} {
		got := mixModel(t, FileQ3_K_S, tt.m, []string{"attn_v"}, false, MixOptions{})
		want := Q3_K
		if tt.is70 {
			want = Q5_K
		}
		if tt.m.NExpert == 8 {
			want = Q8_0
		}
		if l := layers(got, int(tt.m.NLayerAll), "attn_v", want); len(l) != int(tt.m.NLayerAll) {
			t.Errorf("%+v: attn_v %s in %d blocks, want all", tt.m, want, len(l))
		}
	}

	// Options.
	dense := Model{Arch: "qwen3", NHead: 8, NHeadKV: 2, NLayerAll: 2}
	q8, f32 := Q8_0, F32
	got = mixModel(t, FileQ4_K_M, dense, []string{"attn_v"}, true, MixOptions{OutputType: &q8})
	if got["token_embd.weight"] != Q8_0 {
		t.Errorf("tied token_embd with --output-tensor-type q8_0: %s", got["token_embd.weight"])
	}
	got = mixModel(t, FileQ4_K_M, dense, []string{"attn_v"}, false, MixOptions{LeaveOutput: true, TokenEmbdType: &f32})
	if got["output.weight"] != F16 || got["token_embd.weight"] != F32 {
		t.Errorf("--leave-output-tensor --token-embedding-type f32: output %s token_embd %s", got["output.weight"], got["token_embd.weight"])
	}
	got = mixModel(t, FileQ2_K, dense, []string{"attn_v"}, false, MixOptions{})
	if l := layers(got, 2, "attn_v", Q4_K); len(l) != 2 { // n_gqa 4
		t.Errorf("Q2_K n_gqa 4: attn_v Q4_K in %v", l)
	}
	got = mixModel(t, FileF16, dense, []string{"attn_v"}, false, MixOptions{})
	if got["output.weight"] != F16 || got["blk.1.attn_v.weight"] != F16 {
		t.Errorf("F16: %v", got)
	}
	got = mixModel(t, FileBF16, dense, []string{"attn_v"}, false, MixOptions{})
	if got["output.weight"] != BF16 {
		t.Errorf("BF16: output %s", got["output.weight"])
	}
	got = mixModel(t, FileQ4_0, dense, []string{"attn_v", "ffn_down"}, false, MixOptions{HasImatrix: true})
	if got["output.weight"] != Q6_K || got["blk.0.ffn_down.weight"] != Q4_0 {
		t.Errorf("Q4_0: output %s ffn_down %s", got["output.weight"], got["blk.0.ffn_down.weight"])
	}
}

func TestMixFallback(t *testing.T) {
	m := Model{Arch: "qwen3", NHead: 8, NHeadKV: 8, NLayerAll: 1}
	for _, tt := range []struct {
		f    FileType
		ne0  uint64
		want Type
	}{
		{FileQ4_K_M, 288, Q5_0}, {FileQ5_K_S, 288, Q5_1}, {FileQ6_K, 288, Q8_0}, {FileQ2_K, 288, Q4_0},
		{FileQ3_K_S, 288, Q4_0}, {FileQ4_K_M, 48, F16}, {FileQ4_K_M, 512, Q4_K}, {FileQ4_0, 64, Q4_0},
	} {
		ts := []Source{{Name: "blk.0.attn_q.weight", Dims: []uint64{tt.ne0, 8}, Type: F16}}
		got, err := Mix(tt.f, m, ts, MixOptions{})
		if err != nil || got[0] != tt.want {
			t.Errorf("%s row %d: %v %v, want %s", tt.f, tt.ne0, got, err, tt.want)
		}
	}
}

func TestMixRefuses(t *testing.T) {
	m := Model{Arch: "qwen3", NHead: 8, NHeadKV: 8, NLayerAll: 2}
	moe := Model{Arch: "qwen3moe", NHead: 8, NHeadKV: 8, NExpert: 4, NLayerAll: 2}
	q := func(names ...string) []Source {
		var ts []Source
		for _, n := range names {
			ts = append(ts, Source{Name: n, Dims: []uint64{256, 256}, Type: F16})
		}
		return ts
	}
	for _, tt := range []struct {
		name string
		f    FileType
		m    Model
		ts   []Source
		o    MixOptions
		is   error  // errors.Is, or nil
		msg  string // in the message
	}{
		{"IQ2_XXS", 19, m, q("blk.0.attn_q.weight"), MixOptions{}, ErrUnsupportedFileType, "IQ2_XXS"},
		{"MXFP4_MOE", 38, m, q("blk.0.attn_q.weight"), MixOptions{}, ErrUnsupportedFileType, "MXFP4_MOE"},
		{"removed ftype", 4, m, q("blk.0.attn_q.weight"), MixOptions{}, nil, "unknown file type"},
		{"Q2_K_S without imatrix", FileQ2_K_S, m, q("token_embd.weight", "blk.0.attn_q.weight"), MixOptions{}, ErrNeedsImatrix, `"blk.0.attn_q.weight"`},
		{"no blocks", FileQ4_K_M, Model{Arch: "qwen3"}, q("blk.0.attn_q.weight"), MixOptions{}, nil, "block_count is 0"},
		{"too many blocks", FileQ4_K_M, Model{Arch: "qwen3", NLayerAll: 513}, nil, MixOptions{}, nil, "block_count is 513"},
		{"order", FileQ4_K_M, m, q("blk.1.attn_q.weight", "blk.0.attn_q.weight"), MixOptions{}, nil, "not in loader order"},
		{"twice", FileQ4_K_M, m, q("blk.0.attn_q.weight", "blk.0.attn_q.weight"), MixOptions{}, nil, "not in loader order"},
		{"moe layer unreadable", FileQ4_K_M, moe, q("ffn_down_exps.weight"), MixOptions{}, nil, "cannot read the layer"},
		{"moe layer too big", FileQ4_K_M, moe, q("blk.2.ffn_up_exps.weight"), MixOptions{}, nil, "layer 2 is not in [0, 2)"},
		{"no fallback for Q8_0", FileQ8_0, m, []Source{{Name: "blk.0.attn_q.weight", Dims: []uint64{48, 8}}}, MixOptions{}, nil, "no tensor type fallback is defined for type Q8_0"},
		{"bad pattern", FileQ4_K_M, m, nil, MixOptions{TensorTypes: []TensorType{{Pattern: "attn_(v", Type: Q8_0}}}, nil, "attn_(v"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Mix(tt.f, tt.m, tt.ts, tt.o)
			if err == nil || (tt.is != nil && !errors.Is(err, tt.is)) || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %v, want %v containing %q", err, tt.is, tt.msg)
			}
		})
	}
	// A dense model's layer is the running counter: no name needed.
	if _, err := Mix(FileQ4_K_M, m, q("ffn_down_x.weight"), MixOptions{}); err != nil {
		t.Errorf("dense ffn_down without a block: %v", err)
	}
}

func TestLookupFileType(t *testing.T) {
	for _, tt := range []struct {
		in          string
		want        FileType
		unsupported bool
		bad         bool
	}{
		{"Q4_K_M", FileQ4_K_M, false, false}, {"q4_k_m", FileQ4_K_M, false, false}, {"Q4_K", FileQ4_K_M, false, false},
		{"q3_k", FileQ3_K_M, false, false}, {"Q5_K", FileQ5_K_M, false, false}, {"Q8_0", FileQ8_0, false, false},
		{"f16", FileF16, false, false}, {"BF16", FileBF16, false, false}, {"F32", FileF32, false, false},
		{"Q4_0", FileQ4_0, false, false}, {"Q5_1", FileQ5_1, false, false}, {"Q2_K_S", FileQ2_K_S, false, false},
		{"15", FileQ4_K_M, false, false}, {"0", FileF32, false, false},
		{"IQ4_XS", 30, true, false}, {"iq2_m", 29, true, false}, {"TQ1_0", 36, true, false}, {"19", 19, true, false},
		{"COPY", 0, true, false},
		{"Q4_K_X", 0, false, true}, {"Q6", 0, false, true}, {"", 0, false, true}, {"15x", 0, false, true},
		{"4", 0, false, true}, {"Q4_\u212a_M", 0, false, true},
	} {
		f, err := LookupFileType(tt.in)
		switch {
		case tt.bad:
			if err == nil || errors.Is(err, ErrUnsupportedFileType) {
				t.Errorf("%q: %v %v, want an unknown-type error", tt.in, f, err)
			}
		case tt.unsupported:
			if !errors.Is(err, ErrUnsupportedFileType) || f != tt.want {
				t.Errorf("%q: %v %v, want %d unsupported", tt.in, f, err, tt.want)
			}
		default:
			if err != nil || f != tt.want {
				t.Errorf("%q: %v %v, want %s", tt.in, f, err, tt.want)
			}
		}
		if p, ok := ParseFileType(tt.in); ok != (err == nil) || (ok && p != f) {
			t.Errorf("ParseFileType(%q) = %v %v", tt.in, p, ok)
		}
	}
}

func TestModelFromKV(t *testing.T) {
	kv := func(m map[string]any) func(string) (any, bool) {
		return func(k string) (any, bool) { v, ok := m[k]; return v, ok }
	}
	for _, tt := range []struct {
		name string
		kvs  map[string]any
		want Model
		err  string
	}{
		{"scalars", map[string]any{"general.architecture": "qwen3", "qwen3.block_count": uint32(4),
			"qwen3.attention.head_count": uint32(16), "qwen3.attention.head_count_kv": uint32(8)},
			Model{Arch: "qwen3", NHead: 16, NHeadKV: 8, NLayerAll: 4}, ""},
		{"kv defaults to heads", map[string]any{"general.architecture": "llama", "llama.block_count": uint32(2),
			"llama.attention.head_count": uint32(16), "llama.expert_count": uint32(8)},
			Model{Arch: "llama", NHead: 16, NHeadKV: 16, NExpert: 8, NLayerAll: 2}, ""},
		{"arrays", map[string]any{"general.architecture": "nemotron_h", "nemotron_h.block_count": uint32(3),
			"nemotron_h.attention.head_count": []uint32{32, 32, 32}, "nemotron_h.attention.head_count_kv": []int32{0, 2, 0}},
			Model{Arch: "nemotron_h", NHead: 32, NHeadKV: 0, NLayerAll: 3}, ""},
		{"no arch", map[string]any{}, Model{}, "general.architecture"},
		{"no blocks", map[string]any{"general.architecture": "qwen3"}, Model{}, "qwen3.block_count: missing"},
		{"u64 blocks", map[string]any{"general.architecture": "qwen3", "qwen3.block_count": uint64(4)}, Model{}, "want a UINT32"},
		{"short array", map[string]any{"general.architecture": "qwen3", "qwen3.block_count": uint32(4),
			"qwen3.attention.head_count": []uint32{1, 2}}, Model{}, "2 values for 4 blocks"},
		{"float heads", map[string]any{"general.architecture": "qwen3", "qwen3.block_count": uint32(4),
			"qwen3.attention.head_count": float32(2)}, Model{}, "want a UINT32 or an array"},
	} {
		m, err := ModelFromKV(kv(tt.kvs))
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s: %v, want an error with %q", tt.name, err, tt.err)
			}
			continue
		}
		if err != nil || m != tt.want {
			t.Errorf("%s: %+v %v, want %+v", tt.name, m, err, tt.want)
		}
	}
}
