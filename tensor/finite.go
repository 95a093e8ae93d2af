package tensor

import (
	"encoding/binary"
	"math"
)

// NonFinite counts the NaN and ±Inf values (exponent bits all ones) among
// the little-endian dtype-d elements of raw and returns the count and the
// index of the first (-1 when there is none). Only F16, BF16, F32 and F64
// are checked; other dtypes report none. 16-bit data is scanned four
// elements per 64-bit word, so a clean buffer costs about one load and a
// few integer operations per 8 bytes.
func NonFinite(d DType, raw []byte) (n, first int64) {
	first = -1
	switch d {
	case BF16:
		return nonFinite16(raw, 0x7f80)
	case F16:
		return nonFinite16(raw, 0x7c00)
	case F32:
		for i := 0; i+4 <= len(raw); i += 4 {
			if binary.LittleEndian.Uint32(raw[i:])&0x7f800000 == 0x7f800000 {
				if n == 0 {
					first = int64(i / 4)
				}
				n++
			}
		}
	case F64:
		for i := 0; i+8 <= len(raw); i += 8 {
			if math.IsNaN(math.Float64frombits(binary.LittleEndian.Uint64(raw[i:]))) ||
				math.IsInf(math.Float64frombits(binary.LittleEndian.Uint64(raw[i:])), 0) {
				if n == 0 {
					first = int64(i / 8)
				}
				n++
			}
		}
	}
	return n, first
}

// nonFinite16 scans 16-bit elements whose exponent field is exp: a lane of
// x&mask equal to mask is a NaN or infinity. (v−1)&^v has a lane's top bit
// set only at or above a lane of v that is zero; v = (x&mask)^mask never
// sets the top (sign) bit, so that test is exact for "some lane is zero".
func nonFinite16(raw []byte, exp uint16) (n, first int64) {
	first = -1
	const lo, hi = 0x0001000100010001, 0x8000800080008000
	mask := uint64(exp) * lo
	zero := func(w uint64) uint64 {
		v := w&mask ^ mask
		return (v - lo) &^ v & hi
	}
	i := 0
	for ; i+32 <= len(raw); i += 32 {
		r := raw[i : i+32 : i+32]
		if zero(binary.LittleEndian.Uint64(r))|zero(binary.LittleEndian.Uint64(r[8:]))|
			zero(binary.LittleEndian.Uint64(r[16:]))|zero(binary.LittleEndian.Uint64(r[24:])) == 0 {
			continue
		}
		for k := 0; k < 32; k += 2 {
			if binary.LittleEndian.Uint16(raw[i+k:])&exp == exp {
				if n == 0 {
					first = int64((i + k) / 2)
				}
				n++
			}
		}
	}
	for ; i+2 <= len(raw); i += 2 {
		if binary.LittleEndian.Uint16(raw[i:])&exp == exp {
			if n == 0 {
				first = int64(i / 2)
			}
			n++
		}
	}
	return n, first
}
