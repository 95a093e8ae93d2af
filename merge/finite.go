package merge

import (
	"fmt"
	"math"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// Non-finite values. PEFT's safe_merge refuses a merge whose result holds
// NaN or ±Inf ("NaNs detected in the merged weights. The adapter … seems
// to be broken"); its default merge writes them silently. ferry refuses
// what the adapter brings in — a non-finite value in one of its tensors,
// or a merged value that is non-finite where the base value was finite
// (overflow, a DoRA row whose norm is zero) — unless
// ExecOptions.AllowNonFinite is set, and carries NaN/Inf that the base
// already holds through the merge as they are, reporting the counts.

// checkAdapterFinite reads every adapter tensor the plan uses and refuses
// the first NaN or ±Inf, naming the tensor, its row and column. It runs
// before anything is written.
func checkAdapterFinite(p *Plan) error {
	var names []string
	for _, m := range p.Modules {
		names = append(names, m.A, m.B, m.Magnitude, m.LoraBias)
	}
	for _, sp := range p.Shards {
		for _, t := range sp.Tensors {
			if t.Op == OpReplace {
				names = append(names, t.Source)
			}
		}
	}
	ad := p.adapter
	buf := make([]byte, 1<<20)
	for _, name := range names {
		if name == "" {
			continue
		}
		t, ok := ad.Tensor(name)
		if !ok {
			return fmt.Errorf("%s: tensor %q vanished", ad.Path, name)
		}
		es := int64(t.DType.Bits() / 8)
		if es == 0 {
			continue
		}
		sec := ad.Section(t)
		chunk := int64(len(buf)) / es * es
		for off := int64(0); off < sec.Size(); off += chunk {
			b := buf[:min(chunk, sec.Size()-off)]
			if _, err := sec.ReadAt(b, off); err != nil {
				return fmt.Errorf("%s: tensor %q at offset %d: %w", ad.Path, name, ad.DataOffset()+t.Begin+off, err)
			}
			n, first := tensor.NonFinite(t.DType, b)
			if n == 0 {
				continue
			}
			idx := off/es + first
			v := make([]float32, 1)
			tensor.ToF32(t.DType, v, b[first*es:(first+1)*es])
			return inputErr(ad.Path, name, ad.DataOffset()+t.Begin+idx*es, ErrNonFinite,
				"%s holds %v; an adapter must not bring NaN or Inf into the merge (PEFT's safe_merge refuses it too); pass --allow-nonfinite to merge anyway",
				position(t.Shape, idx), v[0])
		}
	}
	return nil
}

// position names element idx of a tensor of that shape: "row R, column C"
// for a matrix, "element I" otherwise.
func position(shape []int64, idx int64) string {
	if len(shape) == 2 && shape[1] > 0 {
		return fmt.Sprintf("row %d, column %d", idx/shape[1], idx%shape[1])
	}
	return fmt.Sprintf("element %d", idx)
}

// checkMerged looks at one block of merged output (out, in dtype dt) whose
// base values (as float32) are base, starting at element first of the
// tensor: it refuses a non-finite value where the base was finite (unless
// allow) and returns how many non-finite values the base brought.
func checkMerged(dt tensor.DType, out []byte, base []float32, first int64, sh *safetensors.Shard, info safetensors.TensorInfo, module string, allow bool) (int64, error) {
	n, k := tensor.NonFinite(dt, out)
	if n == 0 {
		return 0, nil
	}
	es := int64(dt.Bits() / 8)
	v := make([]float32, len(base))
	if err := tensor.ToF32(dt, v[:len(out)/int(es)], out); err != nil {
		return 0, err
	}
	var fromBase int64
	for i := k; i < int64(len(v)); i++ {
		x := float64(v[i])
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			continue
		}
		if b := float64(base[i]); math.IsNaN(b) || math.IsInf(b, 0) {
			fromBase++
			continue
		}
		if allow {
			continue
		}
		idx := first + i
		inSize := int64(info.DType.Bits() / 8)
		return 0, inputErr(sh.Path, info.Name, sh.DataOffset()+info.Begin+idx*inSize, ErrNonFinite,
			"%s: the merge with module %s gives %v where the base holds %v (the adapter makes it non-finite: an overflow, a DoRA norm of zero, or a DoRA row norm over a NaN or Inf of the base); PEFT's safe_merge refuses this too; pass --allow-nonfinite to write it anyway",
			position(info.Shape, idx), module, v[i], base[i])
	}
	return fromBase, nil
}
