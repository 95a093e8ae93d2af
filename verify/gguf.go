package verify

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/quant"
)

// GGUF checks the MTP head of the GGUF file behind r (size bytes long);
// the first part of a split is checked with all its parts (gguf.OpenSplit,
// which opens them beside path). Without Deep it reads only the header and tensor table (gguf.Parse), so
// its cost does not depend on the file's size.
//
// llama.cpp's layout (llamacpp.md §5): <arch>.block_count counts trunk and
// NextN blocks; the last <arch>.nextn_predict_layers blocks are the head,
// each a full-attention decoder block plus blk.N.nextn.{eh_proj, enorm,
// hnorm} (required) and nextn.{shared_head_norm, embed_tokens,
// shared_head_head} (optional).
func GGUF(r io.ReaderAt, size int64, path string, opts Options) (*Report, error) {
	f, err := gguf.Parse(r, size, path)
	if err != nil {
		return nil, err
	}
	// The first part of a split is the whole model: its other parts are
	// read too (the head may be in any of them).
	if f, err = gguf.OpenSplit(f); err != nil {
		return nil, err
	}
	defer f.Close()
	if mm, ok := f.MMProj(); ok {
		return mmprojReport(path, f.Architecture(), mm), nil
	}
	rep := &Report{Path: path, Format: FormatGGUF, Convention: ConvGGUF, TemplateLayer: -1}
	g := &ggufAnalysis{rep: rep, f: f, opts: opts}
	if err := g.run(); err != nil {
		return nil, err
	}
	return rep, nil
}

// mmprojReport is the verdict on a multimodal projector: not applicable.
// An mmproj holds a vision tower and its projector, loaded beside a text
// GGUF (llama.cpp --mmproj); it has no blocks, no nextn_predict_layers and
// cannot carry an MTP head, so there is nothing to check and nothing
// missing.
func mmprojReport(path, arch string, mm gguf.MMProj) *Report {
	return &Report{
		Path: path, Format: FormatGGUF, Arch: arch, TemplateLayer: -1, FoundLayers: []int{},
		Verdict: NotApplicable, MMProj: &mm,
		Message: "not applicable: " + mm.Describe() + ". A multimodal projector is loaded beside a text GGUF and has no MTP head; the text GGUF is the file to check",
	}
}

type ggufAnalysis struct {
	rep  *Report
	f    *gguf.File
	opts Options

	blocks  map[int][]gguf.TensorInfo
	present []gguf.TensorInfo
	// countMismatch: head tensors in blocks the metadata does not assign to
	// the head.
	countMismatch bool
}

// nextnParts are the NextN tensors of an MTP block: name after
// "blk.N.nextn.", whether llama.cpp requires it, and its ggml dims in terms
// of (H = embedding_length, V = vocabulary) — 0 is H, -1 is 2H, -2 is V.
var nextnParts = []struct {
	rel      string
	required bool
	dims     []int
}{
	{"eh_proj.weight", true, []int{-1, 0}}, // {2·n_embd, n_embd}
	{"enorm.weight", true, []int{0}},
	{"hnorm.weight", true, []int{0}},
	{"shared_head_norm.weight", false, []int{0}},
	{"embed_tokens.weight", false, []int{0, -2}},
	{"shared_head_head.weight", false, []int{0, -2}},
}

func (g *ggufAnalysis) uintKV(key string) (uint64, bool, error) {
	kv, ok := g.f.KV(key)
	if !ok {
		return 0, false, nil
	}
	v, ok := kv.Uint()
	if !ok {
		return 0, true, badf(g.f.Path, ErrBadMetadata, "%s is %v (%s), want a non-negative integer", key, kv.Value, kv.Type)
	}
	return v, true, nil
}

func (g *ggufAnalysis) run() error {
	rep, f := g.rep, g.f
	arch := f.Architecture()
	if arch == "" {
		return badf(f.Path, ErrBadMetadata, "no general.architecture")
	}
	rep.Arch = arch
	bc, ok, err := g.uintKV(arch + ".block_count")
	if err != nil {
		return err
	}
	if !ok {
		return badf(f.Path, ErrBadMetadata, "no %s.block_count", arch)
	}
	n, hasKey, err := g.uintKV(arch + ".nextn_predict_layers")
	if err != nil {
		return err
	}
	if bc > 1<<20 || n > 1024 {
		return badf(f.Path, ErrBadMetadata, "%s.block_count = %d, nextn_predict_layers = %d: implausible", arch, bc, n)
	}
	rep.BlockCount = int(bc)
	trunk := ggufTrunk(bc, n)
	if hasKey {
		rep.Promised, rep.PromisedBy = int(n), arch+".nextn_predict_layers"
		if n >= bc && n > 0 {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s = %d is not below %s.block_count = %d (llama.cpp asserts n_layer_nextn < n_layer_all)", rep.PromisedBy, n, arch, bc))
		}
	}
	rep.TrunkLayers = trunk

	// Tensors by block; nextn tensors anywhere.
	g.blocks = map[int][]gguf.TensorInfo{}
	foundSet := map[int]bool{}
	for _, t := range f.Tensors {
		if strings.HasPrefix(t.Name, "nextn.") {
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s: a global NextN tensor (used by other architectures), not checked", t.Name))
			continue
		}
		b, rel, ok := blockOf(t.Name)
		if !ok {
			continue
		}
		g.blocks[b] = append(g.blocks[b], t)
		if b >= trunk {
			foundSet[b] = true
		}
		if strings.HasPrefix(rel, "nextn.") && b < trunk {
			foundSet[b] = true
			g.countMismatch = true
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s is in block %d, a trunk block (the head starts at block %d = block_count %d - nextn_predict_layers %d)",
				t.Name, b, trunk, bc, n))
		}
		if b >= int(bc) {
			g.countMismatch = true
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: block %d is past %s.block_count = %d", t.Name, b, arch, bc))
		}
	}
	for b := range foundSet {
		rep.FoundLayers = append(rep.FoundLayers, b)
	}
	sort.Ints(rep.FoundLayers)
	if rep.FoundLayers == nil {
		rep.FoundLayers = []int{}
	}

	// The head's blocks: the promised ones plus any found.
	var heads []int
	for b := trunk; b < trunk+rep.Promised; b++ {
		heads = append(heads, b)
	}
	for _, b := range rep.FoundLayers {
		if !slices.Contains(heads, b) {
			heads = append(heads, b)
		}
	}
	sort.Ints(heads)
	if len(rep.FoundLayers) > 0 && rep.Promised > 0 && len(rep.FoundLayers) > rep.Promised {
		g.countMismatch = true
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d block(s) hold head tensors but %s = %d", len(rep.FoundLayers), rep.PromisedBy, rep.Promised))
	}
	if len(heads) > 0 {
		g.checkBlocks(heads, trunk)
	}
	if g.opts.Deep {
		rep.Deep = true
		if err := g.deep(); err != nil {
			return err
		}
	}
	rep.Present = len(ggufHead(f, trunk))
	decide(rep, g.countMismatch)
	g.explain(trunk)
	return nil
}

// blockOf splits "blk.N.rest".
func blockOf(name string) (int, string, bool) {
	rest, ok := strings.CutPrefix(name, "blk.")
	if !ok {
		return 0, "", false
	}
	num, rel, ok := strings.Cut(rest, ".")
	if !ok {
		return 0, "", false
	}
	b, err := strconv.Atoi(num)
	if err != nil || b < 0 || strconv.Itoa(b) != num {
		return 0, "", false
	}
	return b, rel, true
}

// template is the last trunk block with full (softmax) attention: Qwen3.5
// hybrids have linear-attention blocks (attn_qkv + ssm_*) in between, and
// the head's block is always full attention.
func (g *ggufAnalysis) template(trunk int) int {
	for b := trunk - 1; b >= 0; b-- {
		for _, t := range g.blocks[b] {
			_, rel, _ := blockOf(t.Name)
			switch rel {
			case "attn_q.weight", "attn_q_a.weight", "attn_q_b.weight", "attn_kv_a_mqa.weight":
				return b
			}
		}
	}
	return -1
}

func (g *ggufAnalysis) dimsOf(spec []int) []int64 {
	h := g.hidden()
	v := g.vocab()
	out := make([]int64, len(spec))
	for i, s := range spec {
		switch s {
		case 0:
			out[i] = h
		case -1:
			out[i] = 2 * h
		case -2:
			out[i] = v
		}
		if out[i] <= 0 {
			return nil
		}
	}
	return out
}

func (g *ggufAnalysis) hidden() int64 {
	v, _, _ := g.uintKV(g.rep.Arch + ".embedding_length")
	return int64(v)
}

func (g *ggufAnalysis) vocab() int64 {
	if t, ok := g.f.Tensor("token_embd.weight"); ok && len(t.Dims) == 2 {
		return int64(t.Dims[1])
	}
	if kv, ok := g.f.KV("tokenizer.ggml.tokens"); ok {
		if a, ok := kv.Value.(gguf.Array); ok {
			return int64(a.Len())
		}
	}
	return 0
}

func dims64(d []uint64) []int64 {
	out := make([]int64, len(d))
	for i, x := range d {
		out[i] = int64(x)
	}
	return out
}

// floatType reports the ggml types a norm may be stored in: the plain
// float types (F32, F16, BF16, F64), whose one element a block is a float.
func floatType(t quant.Type) bool { return !t.Quantized() && len(t.Floats()) > 0 }

func (g *ggufAnalysis) checkBlocks(heads []int, trunk int) {
	rep := g.rep
	tl := g.template(trunk)
	rep.TemplateLayer = tl
	tmpl := map[string]gguf.TensorInfo{}
	var tmplRels []string
	for _, t := range g.blocks[tl] {
		_, rel, _ := blockOf(t.Name)
		tmpl[rel] = t
		tmplRels = append(tmplRels, rel)
	}
	sort.Strings(tmplRels)
	if tl < 0 {
		rep.Notes = append(rep.Notes, "no trunk block with full attention to compare the head's block with (an MTP-only file?); only the nextn tensors' shapes are checked")
	}
	for _, b := range heads {
		have := map[string]gguf.TensorInfo{}
		for _, t := range g.blocks[b] {
			_, rel, _ := blockOf(t.Name)
			have[rel] = t
		}
		done := map[string]bool{}
		record := func(t gguf.TensorInfo, want []int64, required bool, problem string) {
			if problem != "" {
				rep.Problems = append(rep.Problems, t.Name+": "+problem)
			}
			rep.Tensors = append(rep.Tensors, Tensor{Name: t.Name, Required: required, Present: true, DType: t.Type.String(), Shape: dims64(t.Dims), Want: want, Problem: problem})
			g.present = append(g.present, t)
		}
		for _, p := range nextnParts {
			rel := "nextn." + p.rel
			name := fmt.Sprintf("blk.%d.%s", b, rel)
			want := g.dimsOf(p.dims)
			t, ok := have[rel]
			done[rel] = true
			if !ok {
				rep.Tensors = append(rep.Tensors, Tensor{Name: name, Required: p.required, Want: want})
				if p.required {
					rep.Missing = append(rep.Missing, name)
				}
				continue
			}
			problem := ""
			if want != nil && !slices.Equal(dims64(t.Dims), want) {
				problem = fmt.Sprintf("dims %v, want %v", t.Dims, want)
			} else if len(t.Dims) == 1 && !floatType(t.Type) {
				problem = fmt.Sprintf("a norm stored as %s, want a float type", t.Type)
			}
			record(t, want, p.required, problem)
		}
		for _, rel := range tmplRels {
			tt := tmpl[rel]
			name := fmt.Sprintf("blk.%d.%s", b, rel)
			done[rel] = true
			t, ok := have[rel]
			if !ok {
				rep.Missing = append(rep.Missing, name)
				rep.Tensors = append(rep.Tensors, Tensor{Name: name, Required: true, Want: dims64(tt.Dims)})
				continue
			}
			problem := ""
			if !slices.Equal(t.Dims, tt.Dims) {
				problem = fmt.Sprintf("dims %v, but trunk block %d has %v", t.Dims, tl, tt.Dims)
			} else if floatType(tt.Type) != floatType(t.Type) && len(t.Dims) == 1 {
				problem = fmt.Sprintf("type %s, but trunk block %d keeps it as %s", t.Type, tl, tt.Type)
			}
			record(t, dims64(tt.Dims), true, problem)
		}
		var extra []string
		for rel := range have {
			if !done[rel] {
				extra = append(extra, rel)
			}
		}
		sort.Strings(extra)
		for _, rel := range extra {
			problem := ""
			if tl >= 0 {
				problem = fmt.Sprintf("not in trunk block %d", tl)
			}
			record(have[rel], nil, false, problem)
		}
	}
}

// deep reads the present head tensors.
func (g *ggufAnalysis) deep() error {
	rep := g.rep
	for i := range rep.Tensors {
		rt := &rep.Tensors[i]
		if !rt.Present {
			continue
		}
		t, ok := g.f.Tensor(rt.Name)
		if !ok {
			continue
		}
		l, ok := ggmlLayout(t.Type)
		what := "scale"
		if !ok {
			l, what = bytesLayout, "byte"
			rt.Deep = fmt.Sprintf("%s is not decoded: ", t.Type)
		} else if floatType(t.Type) {
			what = "value"
		}
		path, off := g.f.Locate(t) // a split's part
		res, err := scan(g.f.Section(t), t.Size(), l)
		rep.BytesRead += res.bytes
		if err != nil {
			return &Error{Path: path, Tensor: t.Name, Offset: off, Err: err}
		}
		text, problem := res.text(what, l.unit, off)
		rt.Deep += text
		if problem != "" {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s: %s", t.Name, problem))
		}
	}
	return nil
}

func (g *ggufAnalysis) explain(trunk int) {
	rep := g.rep
	key := rep.Arch + ".nextn_predict_layers"
	switch rep.Verdict {
	case OK:
		rep.Message = fmt.Sprintf("%s = %d and block_count = %d: block(s) %s hold all %d head tensors, consistent with trunk block %d",
			key, rep.Promised, rep.BlockCount, blockList(rep.FoundLayers), rep.Expected, rep.TemplateLayer)
	case Absent:
		rep.Message = fmt.Sprintf("no MTP head: no %s key and no nextn tensors (converted with --no-mtp, or the model has no head)", key)
	case Dropped:
		rep.Message = fmt.Sprintf("%s = %d and block_count = %d promise head block(s) from blk.%d, but the file has no tensor there; llama.cpp refuses to load it (tensor 'blk.%d.attn_norm.weight' not found). "+
			"It was converted from a checkpoint without mtp.* (a PEFT merge drops them: re-merge with `ferry merge`) or by a convert_hf_to_gguf.py older than 2026-05-16, which dropped them. "+
			"Fix: convert again from a checkpoint that has the head, without --no-mtp (`ferry gguf convert` keeps it), and quantize from that file",
			key, rep.Promised, rep.BlockCount, trunk, trunk)
	case Partial:
		rep.Message = fmt.Sprintf("%s = %d but only %d of %d head tensors are in the file; missing: %s",
			key, rep.Promised, rep.Present, rep.Expected, abbreviate(rep.Missing, 6))
	case Inconsistent:
		if rep.Promised == 0 {
			rep.Message = fmt.Sprintf("head tensors are in block(s) %s but there is no %s key, so llama.cpp treats every block as a trunk layer. "+
				"Fix: convert again without --no-mtp (the converter writes the key and block_count together)", blockList(rep.FoundLayers), key)
		} else {
			rep.Message = "the MTP head is present but disagrees with the metadata or the trunk: " + abbreviate(rep.Problems, 4)
		}
	}
}

func blockList(bs []int) string {
	s := make([]string, len(bs))
	for i, b := range bs {
		s[i] = "blk." + strconv.Itoa(b)
	}
	return strings.Join(s, ", ")
}
