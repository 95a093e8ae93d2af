package convert

import (
	"fmt"
	"strings"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// source is one checkpoint tensor, viewed as rows × cols (any factorisation
// of its element count: a reshape of a contiguous tensor moves no data).
type source struct {
	HFName string // name in the checkpoint
	Loc    safetensors.Location
	DType  tensor.DType
}

// elemOp is an element-wise float32 transform.
type elemOp uint8

const (
	opAddOne    elemOp = iota + 1 // x + 1 (Qwen3-Next / Qwen3.5 RMSNorm weights)
	opNegExp                      // -exp(x) in float32 (A_log → ssm_a), torch's float32 exp
	opNegExpF16                   // -exp(x) of an F16 A_log: torch's float16 exp
	opAddOneF16                   // x + 1 of an F16 norm weight, rounded to float16 as torch's half add
)

func (o elemOp) String() string {
	switch o {
	case opAddOne:
		return "+1"
	case opNegExp:
		return "-exp"
	case opNegExpF16:
		return "-exp (f16)"
	case opAddOneF16:
		return "+1 (f16)"
	}
	return "?"
}

// vtensor is a tensor as the converter's modify chain sees it: a name, a
// torch-order shape, and how to produce its values from checkpoint bytes
// without holding them: output row i (rows = product of all dims but the
// last, cols = the last dim) is row row(i) of source src(i), viewed with
// cols columns, its columns permuted by col (nil: identity), then ops
// applied in order.
type vtensor struct {
	Name  string
	Shape []int64
	srcs  []*source
	row   func(i int64) (src int, row int64)
	col   func(c int64) int64
	ops   []elemOp
	desc  []string // transform log, for plans and errors
}

func (v *vtensor) rows() int64 {
	r := int64(1)
	for _, d := range v.Shape[:max(len(v.Shape)-1, 0)] {
		r *= d
	}
	return r
}

func (v *vtensor) cols() int64 {
	if len(v.Shape) == 0 {
		return 1
	}
	return v.Shape[len(v.Shape)-1]
}

func (v *vtensor) numel() int64 { return v.rows() * v.cols() }

// clone copies v under a new name.
func (v *vtensor) renamed(name string) *vtensor {
	w := *v
	w.Name = name
	w.Shape = append([]int64(nil), v.Shape...)
	w.desc = append([]string(nil), v.desc...)
	w.ops = append([]elemOp(nil), v.ops...)
	return &w
}

func newSourceTensor(name string, s *source, shape []int64) *vtensor {
	return &vtensor{
		Name:  name,
		Shape: append([]int64(nil), shape...),
		srcs:  []*source{s},
		row:   func(i int64) (int, int64) { return 0, i },
	}
}

func (v *vtensor) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %v", v.Name, v.Shape)
	if len(v.desc) > 0 {
		fmt.Fprintf(&b, " [%s]", strings.Join(v.desc, ", "))
	}
	return b.String()
}

// withOp appends an element-wise op.
func (v *vtensor) withOp(op elemOp) *vtensor {
	w := v.renamed(v.Name)
	w.ops = append(w.ops, op)
	w.desc = append(w.desc, op.String())
	return w
}

// reshape changes the shape keeping cols (the row mapping is unchanged when
// the last dimension is); used for squeeze of middle dims.
func (v *vtensor) reshapeKeepCols(shape []int64, what string) (*vtensor, error) {
	w := v.renamed(v.Name)
	w.Shape = append([]int64(nil), shape...)
	if w.cols() != v.cols() || w.rows() != v.rows() {
		return nil, fmt.Errorf("%s: cannot %s %v to %v without moving data", v.Name, what, v.Shape, shape)
	}
	w.desc = append(w.desc, what)
	return w, nil
}

// gatherRows makes output row i = input row g(i); shape unchanged unless
// given.
func (v *vtensor) gatherRows(g func(i int64) int64, what string) *vtensor {
	w := v.renamed(v.Name)
	inner := v.row
	w.row = func(i int64) (int, int64) { return inner(g(i)) }
	w.desc = append(w.desc, what)
	return w
}

// sliceRows keeps rows [from, from+n) of each group of groupRows rows (the
// leading dims collapse to groups), with the new shape.
func (v *vtensor) gatherRowsShape(shape []int64, g func(i int64) int64, what string) *vtensor {
	w := v.gatherRows(g, what)
	w.Shape = append([]int64(nil), shape...)
	return w
}

// permuteCols makes output column c = input column p(c).
func (v *vtensor) permuteCols(p func(c int64) int64, what string) *vtensor {
	w := v.renamed(v.Name)
	inner := v.col
	if inner == nil {
		w.col = p
	} else {
		w.col = func(c int64) int64 { return inner(p(c)) }
	}
	w.desc = append(w.desc, what)
	return w
}

// stack concatenates same-shaped tensors along a new leading dimension
// (torch.stack(dim=0)). Column permutations and ops must agree (none is
// used on experts).
func stack(name string, parts []*vtensor) (*vtensor, error) {
	if len(parts) == 0 {
		return nil, fmt.Errorf("%s: nothing to stack", name)
	}
	first := parts[0]
	w := &vtensor{Name: name, Shape: append([]int64{int64(len(parts))}, first.Shape...)}
	R := first.rows()
	offs := make([]int, len(parts))
	rowFns := make([]func(int64) (int, int64), len(parts))
	for k, p := range parts {
		if fmt.Sprint(p.Shape) != fmt.Sprint(first.Shape) {
			return nil, fmt.Errorf("%s: stacking %s %v with %s %v", name, first.Name, first.Shape, p.Name, p.Shape)
		}
		if p.col != nil || len(p.ops) > 0 {
			return nil, fmt.Errorf("%s: stacking transformed tensors is not supported", name)
		}
		offs[k] = len(w.srcs)
		w.srcs = append(w.srcs, p.srcs...)
		rowFns[k] = p.row
	}
	w.row = func(i int64) (int, int64) {
		k := i / R
		s, r := rowFns[k](i % R)
		return offs[k] + s, r
	}
	w.desc = []string{fmt.Sprintf("stack %d", len(parts))}
	return w, nil
}

// vHeadReorder is _reorder_v_heads: along an axis of nk·r·hd entries laid
// out grouped by K head [k][v][d], produce the tiled order [v][k][d].
// It returns the input index for output index o.
func vHeadReorder(nk, r, hd int64) func(o int64) int64 {
	return func(o int64) int64 {
		v := o / (nk * hd)
		k := (o / hd) % nk
		d := o % hd
		return k*r*hd + v*hd + d
	}
}

// llamaPermute is LlamaModel.permute on rows: within each head of hd rows,
// output row (h, b, a) comes from input row (h, a, b), a ∈ {0, 1}.
func llamaPermute(nHead, rows int64) func(o int64) int64 {
	hd := rows / nHead
	half := hd / 2
	return func(o int64) int64 {
		h := o / hd
		j := o % hd
		b, a := j/2, j%2
		return h*hd + a*half + b
	}
}
