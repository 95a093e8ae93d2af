package quant

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/ferry-llm/ferry/tensor"
)

// ErrNoDecoder is returned for a type ferry cannot decode.
var ErrNoDecoder = errors.New("no decoder")

// The decoders in this file (each a row's Decode in the type table) turn
// whole blocks back into float32 values, as ggml's dequantize_row_*
// (ggml-quants.c) and ggml_fp16_to_fp32_row / ggml_bf16_to_fp32_row (ggml.c) at llama.cpp
// 34af94c do. Products are rounded to float32 before a minimum is
// subtracted (no FMA on arm64), so the values are ggml's bit for bit; only
// the payload of a NaN made from two NaNs or an invalid operation (Inf·0)
// may differ, as it does between x86-64 and arm64 builds of ggml.

// CanDecode reports whether Decode handles t: whether its row has a
// decoder.
func (t Type) CanDecode() bool { return t.row().Decode != nil }

// Decode writes the values of src, blocks of type t, into dst. dst's
// length must be a whole number of t's blocks; src must hold
// len(dst)/BlockSize blocks of TypeSize bytes.
func Decode(t Type, dst []float32, src []byte) error {
	r := t.row()
	if r.Decode == nil {
		return fmt.Errorf("%w for %s", ErrNoDecoder, t)
	}
	need, err := r.blockBytes(len(dst), len(src))
	if err != nil {
		return err
	}
	r.Decode(dst, src[:need])
	return nil
}

// half reads the IEEE half at b as ggml_compute_fp16_to_fp32 does: exact,
// and a signalling NaN comes out quiet, because ggml widens it with a
// float multiply.
func half(b []byte) float32 {
	h := binary.LittleEndian.Uint16(b)
	f := tensor.F16ToFloat32(h)
	if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
		f = math.Float32frombits(math.Float32bits(f) | 1<<22)
	}
	return f
}

func decodeF16(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = half(src[2*i:])
	}
}

// decodeQ8_0: q·d.
func decodeQ8_0(dst []float32, src []byte) {
	for bi := 0; bi*32 < len(dst); bi++ {
		b := src[bi*34 : bi*34+34]
		y := dst[bi*32 : bi*32+32]
		d := half(b)
		for j, q := range b[2:34] {
			y[j] = float32(int8(q)) * d
		}
	}
}

// decodeQ2_K: 16 groups of 16, each (d·sc)·q - dmin·m with sc and m the
// low and high nibble of its scale byte. Each 128-value half reads 32
// bytes of qs four times, two bits further each time: group 2i from
// bytes 0-15, group 2i+1 from bytes 16-31.
func decodeQ2_K(dst []float32, src []byte) {
	for bi := 0; bi*QK_K < len(dst); bi++ {
		b := src[bi*84 : bi*84+84]
		y := dst[bi*QK_K : bi*QK_K+QK_K]
		scales, qs := b[0:16], b[16:80]
		d, dmin := half(b[80:]), half(b[82:])
		for g := 0; g < 16; g++ {
			sc := scales[g]
			dl := d * float32(sc&0xF)
			ml := dmin * float32(sc>>4)
			q := qs[g/8*32+g%2*16:][:16]
			shift := uint(g % 8 / 2 * 2)
			for l, v := range q {
				y[g*16+l] = float32(dl*float32(v>>shift&3)) - ml
			}
		}
	}
}

// decodeQ3_K: 16 groups of 16, each d·(sc-32)·(q-4·(hmask bit clear)),
// the 2-bit q packed as in Q2_K, the third bit of group g's value l at bit
// g/2 of hmask[l + 16·(g%2)].
func decodeQ3_K(dst []float32, src []byte) {
	for bi := 0; bi*QK_K < len(dst); bi++ {
		b := src[bi*110 : bi*110+110]
		y := dst[bi*QK_K : bi*QK_K+QK_K]
		hmask, qs, sb := b[0:32], b[32:96], b[96:108]
		d := half(b[108:])
		for g := 0; g < 16; g++ {
			dl := d * float32(q3Scale(sb, g)-32)
			q := qs[g/8*32+g%2*16:][:16]
			hm := hmask[g%2*16:][:16]
			shift := uint(g % 8 / 2 * 2)
			bit := byte(1) << (g / 2)
			for l, v := range q {
				w := int(v >> shift & 3)
				if hm[l]&bit == 0 {
					w -= 4
				}
				y[g*16+l] = dl * float32(w)
			}
		}
	}
}

// q3Scale is the 6-bit scale of group g of a Q3_K block: its low nibble in
// byte g (g < 8) or the high nibble of byte g-8, its top two bits at bit
// 2·(g/4) of byte 8 + g%4.
func q3Scale(sb []byte, g int) int {
	lo := sb[g%8]
	if g >= 8 {
		lo >>= 4
	}
	return int(lo&0xF) | int(sb[8+g%4]>>(2*(g/4))&3)<<4
}

// scaleMinK4 is get_scale_min_k4: the 6-bit scale and min of sub-block j
// of a Q4_K or Q5_K block's 12 scale bytes.
func scaleMinK4(j int, q []byte) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0xF | q[j-4]>>6<<4, q[j+4]>>4 | q[j]>>6<<4
}

// decodeQ4_K: 8 sub-blocks of 32, each (d·sc)·q - dmin·m; sub-blocks 2c
// and 2c+1 are the low and high nibbles of qs[32c : 32c+32].
func decodeQ4_K(dst []float32, src []byte) {
	for bi := 0; bi*QK_K < len(dst); bi++ {
		b := src[bi*144 : bi*144+144]
		y := dst[bi*QK_K : bi*QK_K+QK_K]
		d, dmin := half(b), half(b[2:])
		sb, qs := b[4:16], b[16:144]
		for s := 0; s < 8; s++ {
			sc, m := scaleMinK4(s, sb)
			d1, m1 := d*float32(sc), dmin*float32(m)
			shift := uint(s % 2 * 4)
			for l, v := range qs[s/2*32 : s/2*32+32] {
				y[s*32+l] = float32(d1*float32(v>>shift&0xF)) - m1
			}
		}
	}
}

// decodeQ5_K: as Q4_K, with the fifth bit of sub-block s's value l at bit
// s of qh[l].
func decodeQ5_K(dst []float32, src []byte) {
	for bi := 0; bi*QK_K < len(dst); bi++ {
		b := src[bi*176 : bi*176+176]
		y := dst[bi*QK_K : bi*QK_K+QK_K]
		d, dmin := half(b), half(b[2:])
		sb, qh, qs := b[4:16], b[16:48], b[48:176]
		for s := 0; s < 8; s++ {
			sc, m := scaleMinK4(s, sb)
			d1, m1 := d*float32(sc), dmin*float32(m)
			shift := uint(s % 2 * 4)
			for l, v := range qs[s/2*32 : s/2*32+32] {
				w := v >> shift & 0xF
				if qh[l]&(1<<s) != 0 {
					w += 16
				}
				y[s*32+l] = float32(d1*float32(w)) - m1
			}
		}
	}
}

// decodeQ6_K: 16 groups of 16, each (d·sc)·(q-32), sc a signed byte. In
// each 128-value half, value l (0..31) of quarter k takes its low nibble
// from ql[l + 32·(k%2)] (low half for k < 2, high for k ≥ 2) and its top
// two bits from bits 2k of qh[l].
// q6Value is float32(q - 32) for every 6-bit Q6_K level q.
var q6Value = func() (v [64]float32) {
	for q := range v {
		v[q] = float32(q - 32)
	}
	return v
}()

func decodeQ6_K(dst []float32, src []byte) {
	for bi := 0; bi*QK_K < len(dst); bi++ {
		b := src[bi*210 : bi*210+210]
		y := dst[bi*QK_K : bi*QK_K+QK_K]
		d := half(b[208:])
		for h := 0; h < 2; h++ {
			ql, qh, sc := b[h*64:h*64+64], b[128+h*32:128+h*32+32], b[192+h*8:192+h*8+8]
			out := y[h*128 : h*128+128]
			for k := 0; k < 4; k++ {
				shift := uint(k / 2 * 4)
				qlk := ql[32*(k%2) : 32*(k%2)+32]
				for g := 0; g < 2; g++ {
					// d·scale once per 16 values: the reference's
					// d * scale * q is (d * scale) * q, the same bits.
					ds := d * float32(int8(sc[g+2*k]))
					o := out[32*k+16*g : 32*k+16*g+16]
					for l := range o {
						i := 16*g + l
						q := qlk[i]>>shift&0xF | (qh[i]>>(2*k)&3)<<4
						o[l] = ds * q6Value[q]
					}
				}
			}
		}
	}
}
