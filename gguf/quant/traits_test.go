package quant

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// checkRow is what makes a row of the type table whole, whatever the
// type: sizes, float fields inside the block, an encoder only with the
// decoder that reads its output back and the scales Validate checks, a
// weighted encoder only beside a plain one, a fallback ferry can write
// wherever the type itself can be written, and an encoder and decoder that
// agree (a round trip through Encode, EncodeWeighted and Decode lands near
// the input, and writes nothing past the blocks it was given).
func checkRow(r Traits) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if r.Name == "" || r.BlockSize < 1 || r.TypeSize < 1 || r.Type >= typeCodes {
		return fmt.Errorf("type %d %q: a row needs a code below %d, a name, a block size and a type size (have %d, %d)", r.Type, r.Name, typeCodes, r.BlockSize, r.TypeSize)
	}
	for _, f := range r.Floats {
		size := map[FloatKind]int64{Half: 2, BFloat16: 2, Float32: 4, Float64: 8}[f.Kind]
		if size == 0 || f.Offset < 0 || int64(f.Offset)+size > r.TypeSize {
			bad("field %s at %d (kind %d) outside the %d-byte block", f.Name, f.Offset, f.Kind, r.TypeSize)
		}
	}
	if r.Encode != nil && r.Decode == nil {
		bad("an encoder and no decoder: what ferry writes it must read back (quality report, requantizing)")
	}
	if r.Encode != nil && len(r.Floats) == 0 {
		bad("an encoder and no float fields: Validate could not check the scales it writes")
	}
	if r.EncodeWeighted != nil && r.Encode == nil {
		bad("a weighted encoder and no plain one: tensors the importance matrix lacks are encoded without weights")
	}
	if fb := r.Fallback; fb != F32 {
		switch {
		case r.BlockSize == 1:
			bad("a fallback for a type whose rows always divide")
		case !fb.Quantized() || fb.BlockSize() >= r.BlockSize || r.BlockSize%fb.BlockSize() != 0:
			bad("fallback %s: want a block type with smaller blocks that divide %d", fb, r.BlockSize)
		case fb.row().Fallback != F32:
			bad("fallback %s has a fallback of its own: tensor_type_fallback takes one step, then F16", fb)
		case r.Encode != nil && !fb.CanEncode():
			bad("fallback %s cannot be encoded: a tensor of %s whose rows do not divide could not be written", fb, r.Name)
		}
	}
	if r.Encode != nil && r.Decode != nil {
		if err := roundTrip(r); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s: %w", r.Name, errors.Join(errs...))
	}
	return nil
}

// roundTrip encodes two rows of weights drawn like a trained layer's, with
// and without importance weights, decodes them, and checks that every
// byte of the blocks is written and none past them (the row's TypeSize is
// the encoder's), and that the values come back within half the rows' RMS
// (a decoder that reads another layout is far outside it: Q2_K, the
// coarsest type ferry writes, comes back within about 0.3 of it).
func roundTrip(r Traits) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("round trip: %v (an encoder or decoder that runs past the row's blocks)", p)
		}
	}()
	const rows = 2
	n := int(max(r.BlockSize, QK_K/r.BlockSize*r.BlockSize, 2*r.BlockSize))
	rng := rand.New(rand.NewPCG(7, uint64(r.Type)))
	src := make([]float32, rows*n)
	qw := make([]float32, n)
	for i := range src {
		src[i] = float32(rng.NormFloat64() * 0.02)
	}
	for i := range qw {
		qw[i] = float32(rng.ExpFloat64())
	}
	size := rows * n / int(r.BlockSize) * int(r.TypeSize)
	for _, weights := range [][]float32{nil, qw} {
		var enc [2][]byte
		for k, fill := range []byte{0x00, 0xFF} {
			enc[k] = make([]byte, size)
			for i := range enc[k] {
				enc[k][i] = fill
			}
			if err := EncodeWeighted(r.Type, enc[k][:size:size], src, n, weights); err != nil {
				return fmt.Errorf("EncodeWeighted (weights %v): %w", weights != nil, err)
			}
		}
		for i := range enc[0] {
			if enc[0][i] != enc[1][i] {
				return fmt.Errorf("encoding (weights %v) left byte %d of %d unwritten: the type size is not the encoder's", weights != nil, i, size)
			}
		}
		got := make([]float32, len(src))
		if err := Decode(r.Type, got[:len(src):len(src)], enc[0]); err != nil {
			return fmt.Errorf("Decode: %w", err)
		}
		var sq, errSq float64
		for i, x := range src {
			sq += float64(x) * float64(x)
			e := float64(got[i]) - float64(x)
			errSq += e * e
		}
		if rel := math.Sqrt(errSq / sq); !(rel < 0.5) {
			return fmt.Errorf("round trip (weights %v): RMS error %.3g of the values' RMS, want below 0.5", weights != nil, rel)
		}
	}
	return nil
}

// TestTraitsComplete: every row of the type table is whole (checkRow), and
// the table says what ggml says of each type. Adding a ggml type, or an
// encoder for one, is filling in its row; this test says what the row
// still lacks.
func TestTraitsComplete(t *testing.T) {
	// The types whose quantize_* in ggml-quants.c (34af94c) reads the
	// importance weights, of those ferry encodes: quantize_q8_0 discards
	// them ("(void)quant_weights; // not used") and the float types never
	// get them.
	weighted := map[Type]bool{Q4_0: true, Q4_1: true, Q5_0: true, Q5_1: true, Q2_K: true, Q3_K: true, Q4_K: true, Q5_K: true, Q6_K: true}
	// tensor_type_fallback at 34af94c (llamacpp.md §3.6).
	fallbacks := map[Type]Type{
		Q2_K: Q4_0, Q3_K: Q4_0, Q2_0: Q4_0, TQ1_0: Q4_0, TQ2_0: Q4_0, Q4_K: Q5_0, Q5_K: Q5_1, Q6_K: Q8_0,
		IQ1_S: IQ4_NL, IQ1_M: IQ4_NL, IQ2_XXS: IQ4_NL, IQ2_XS: IQ4_NL, IQ2_S: IQ4_NL, IQ3_XXS: IQ4_NL, IQ3_S: IQ4_NL, IQ4_XS: IQ4_NL,
	}
	// type_traits[].is_quantized is false for exactly these.
	plain := map[Type]bool{F32: true, F16: true, BF16: true, F64: true, I8: true, I16: true, I32: true, I64: true}

	if len(rows) != len(Types()) {
		t.Errorf("%d rows, %d types in the table", len(rows), len(Types()))
	}
	names := map[string]Type{}
	for code, r := range table {
		if r.Name == "" {
			continue
		}
		ty := Type(code)
		if r.Type != ty {
			t.Errorf("row %s at code %d says code %d", r.Name, code, r.Type)
		}
		if err := checkRow(r); err != nil {
			t.Error(err)
		}
		up := strings.ToUpper(r.Name)
		if other, dup := names[up]; dup {
			t.Errorf("%s and %s share a name (ParseType is case-insensitive)", other, ty)
		}
		names[up] = ty
		if p, ok := ParseType(strings.ToLower(r.Name)); !ok || p != ty {
			t.Errorf("ParseType(%q) = %v %v", strings.ToLower(r.Name), p, ok)
		}
		if r.Encode != nil && (r.EncodeWeighted != nil) != weighted[ty] {
			t.Errorf("%s: weighted encoder %v, llama-quantize weights it: %v", ty, r.EncodeWeighted != nil, weighted[ty])
		}
		if r.Fallback != fallbacks[ty] {
			t.Errorf("%s: fallback %s, tensor_type_fallback gives %s", ty, r.Fallback, fallbacks[ty])
		}
		if ty.Quantized() == plain[ty] {
			t.Errorf("%s: Quantized() = %v", ty, ty.Quantized())
		}
		if got, ok := TraitsOf(ty); !ok || got.Name != r.Name || got.TypeSize != r.TypeSize {
			t.Errorf("TraitsOf(%s) = %+v %v", ty, got, ok)
		}
	}
	for _, ty := range []Type{typeCodes - 1, typeCodes, 1 << 31} {
		if _, ok := TraitsOf(ty); ok || ty.Known() || ty.Quantized() || ty.CanEncode() || ty.CanDecode() || ty.BlockSize() != 0 {
			t.Errorf("type %d: has a row", uint32(ty))
		}
	}
}

// TestCheckRowCatches: checkRow refuses each kind of half-made row, so
// TestTraitsComplete cannot pass on one.
func TestCheckRowCatches(t *testing.T) {
	q4 := Q4_K.row()
	for _, tt := range []struct {
		name string
		edit func(r *Traits)
		want string
	}{
		{"no decoder", func(r *Traits) { r.Decode = nil }, "no decoder"},
		{"no floats", func(r *Traits) { r.Floats = nil }, "no float fields"},
		{"weighted alone", func(r *Traits) { r.Encode, r.Decode = nil, nil }, "no plain one"},
		{"another type's decoder", func(r *Traits) { r.Decode = Q5_K.row().Decode }, "round trip"},
		{"a larger size", func(r *Traits) { r.TypeSize = 176 }, "unwritten"},
		{"a smaller size", func(r *Traits) { r.TypeSize = 110 }, "runs past"},
		{"fallback without encoder", func(r *Traits) { r.Fallback = IQ4_NL }, "cannot be encoded"},
		{"fallback with larger blocks", func(r *Traits) { r.Fallback = Q2_K }, "smaller blocks"},
		{"float outside the block", func(r *Traits) { r.Floats = []Field{{"d", 143, Half}} }, "outside"},
		{"no size", func(r *Traits) { r.TypeSize = 0 }, "type size"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := *q4
			tt.edit(&r)
			// A row is checked where it would be used: in the table.
			saved := table[r.Type]
			table[r.Type] = r
			err := checkRow(r)
			table[r.Type] = saved
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("checkRow: %v, want an error saying %q", err, tt.want)
			}
		})
	}
	if err := checkRow(*q4); err != nil {
		t.Errorf("Q4_K's own row: %v", err)
	}
}
