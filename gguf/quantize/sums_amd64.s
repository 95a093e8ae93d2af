#include "textflag.h"

// func sumsAVX2(x, y *float32, groups int, acc *lanes)
//
// sumLanesGo with the four lanes in one YMM register of float64s: per
// group of four values, each scalar operation of the Go form is one
// instruction, in the same order (products and sums are separate VMULPD
// and VADDPD, never an FMA), so every lane gets the scalar code's bits.
// The maximum is VMAXPD with the new |d| first and the running maximum
// second: it returns the second unless the first is greater, NaN
// included, as Go's `if a > max { max = a }` does.
TEXT ·sumsAVX2(SB), NOSPLIT, $0-32
	MOVQ x+0(FP), SI
	MOVQ y+8(FP), DI
	MOVQ groups+16(FP), CX
	MOVQ acc+24(FP), DX
	VMOVUPD 0(DX), Y0        // sq
	VMOVUPD 32(DX), Y1       // xy
	VMOVUPD 64(DX), Y2       // xx
	VMOVUPD 96(DX), Y3       // yy
	VMOVUPD 128(DX), Y4      // max
	MOVQ $0x7fffffffffffffff, AX
	VMOVQ AX, X15
	VPBROADCASTQ X15, Y15    // |·| mask
	TESTQ CX, CX
	JZ done

loop:
	VCVTPS2PD (SI), Y5       // x
	VCVTPS2PD (DI), Y6       // y
	VSUBPD Y5, Y6, Y7        // d = y - x
	VMULPD Y7, Y7, Y8
	VADDPD Y8, Y0, Y0        // sq += d*d
	VMULPD Y6, Y5, Y8
	VADDPD Y8, Y1, Y1        // xy += x*y
	VMULPD Y5, Y5, Y8
	VADDPD Y8, Y2, Y2        // xx += x*x
	VMULPD Y6, Y6, Y8
	VADDPD Y8, Y3, Y3        // yy += y*y
	VANDPD Y15, Y7, Y8       // |d|
	VMAXPD Y4, Y8, Y4        // max = |d| > max ? |d| : max
	ADDQ $16, SI
	ADDQ $16, DI
	DECQ CX
	JNZ loop

done:
	VMOVUPD Y0, 0(DX)
	VMOVUPD Y1, 32(DX)
	VMOVUPD Y2, 64(DX)
	VMOVUPD Y3, 96(DX)
	VMOVUPD Y4, 128(DX)
	VZEROUPPER
	RET
