package quant

import (
	"encoding/binary"
	"math"
)

// NonFinite is where Validate found a NaN or an infinity.
type NonFinite struct {
	Block int    // index of the block (of the value, for F16, BF16, F32)
	Field string // the block's field: "d", "dmin", "m", or "x" for a value
}

// Validate is ggml_validate_row_data for the types ferry writes: it
// returns the first block of data (whole blocks of t) whose scales or
// minimums (every value, for a float type) are NaN or infinite, and false
// when there is none. llama-quantize runs it on every tensor it has just
// quantized and fails the whole run on one such block ("quantized data
// validation failed"): a NaN or an infinity in a quantized tensor's input
// gives a non-finite scale, and a model that cannot run.
func Validate(t Type, data []byte) (NonFinite, bool) {
	fs := t.Floats()
	size := int(t.TypeSize())
	for b := 0; b+size <= len(data); b += size {
		for _, f := range fs {
			x := data[b+f.Offset:]
			var bad bool
			switch f.Kind {
			case Half:
				bad = binary.LittleEndian.Uint16(x)&0x7C00 == 0x7C00
			case BFloat16:
				bad = binary.LittleEndian.Uint16(x)&0x7F80 == 0x7F80
			case Float32:
				bad = binary.LittleEndian.Uint32(x)&0x7F800000 == 0x7F800000
			case Float64:
				v := math.Float64frombits(binary.LittleEndian.Uint64(x))
				bad = math.IsNaN(v) || math.IsInf(v, 0)
			}
			if bad {
				return NonFinite{Block: b / size, Field: f.Name}, true
			}
		}
	}
	return NonFinite{}, false
}
