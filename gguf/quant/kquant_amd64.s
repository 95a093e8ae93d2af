#include "textflag.h"

// BCAST fills every 32-bit lane of y with the constant v (x is y's low half).
// Every move into an X register here is VEX-encoded (VMOVD, not MOVL): a
// legacy SSE instruction after a YMM write with the upper halves dirty
// costs an SSE/AVX state transition on Intel cores, and these few moves
// took 60 % of Q6_K's time on the device's Xeon (none on AMD).
#define BCAST(v, x, y) MOVL $v, AX; VMOVD AX, x; VPBROADCASTD x, y

// AVX2 forms of the kernels in kquant_kernels.go: eight lanes (groups)
// per instruction, one row of a [32][8]float32 per YMM register. Each
// scalar operation of the Go form is one instruction here, in the same
// order; products and sums are separate VMULPS and VADDPS (never an FMA),
// so every lane gets the bits of the scalar code. nearest_int is the same
// trick: add 1.5·2^23 (0x4B400000), keep the low 23 bits, subtract 2^22.

// func levelsAVX2(x, w *groups, lo, iscale *[8]float32, nmax int32, n int, laux *[32][8]int32, sums *[3][8]float32)
TEXT ·levelsAVX2(SB), NOSPLIT, $0-64
	MOVQ x+0(FP), DX
	MOVQ w+8(FP), R8
	MOVQ lo+16(FP), AX
	VMOVUPS (AX), Y14
	MOVQ iscale+24(FP), AX
	VMOVUPS (AX), Y0
	MOVL nmax+32(FP), AX
	VMOVD AX, X1
	VPBROADCASTD X1, Y1
	BCAST(0x4B400000, X2, Y2)
	BCAST(0x007fffff, X3, Y3)
	BCAST(0x00400000, X4, Y4)
	VPXOR Y5, Y5, Y5
	MOVQ n+40(FP), CX
	MOVQ laux+48(FP), DI
	MOVQ sums+56(FP), BX
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	TESTQ CX, CX
	JZ   ldone

lloop:
	VMOVUPS   (DX), Y13      // x
	VSUBPS    Y14, Y13, Y9   // x - lo
	VMULPS    Y9, Y0, Y9     // iscale·(x - lo)
	VADDPS    Y2, Y9, Y9     // + 1.5·2^23
	VPAND     Y3, Y9, Y9
	VPSUBD    Y4, Y9, Y9     // nearest_int
	VPMINSD   Y1, Y9, Y9
	VPMAXSD   Y5, Y9, Y9     // clamp to [0, nmax]
	VMOVDQU   Y9, (DI)
	VCVTDQ2PS Y9, Y10        // l as float
	VMULPS    (R8), Y10, Y11 // wl = w·l
	VADDPS    Y11, Y6, Y6    // Σ w·l
	VMULPS    Y10, Y11, Y12
	VADDPS    Y12, Y7, Y7    // Σ (w·l)·l
	VMULPS    Y13, Y11, Y13
	VADDPS    Y13, Y8, Y8    // Σ (w·l)·x
	ADDQ      $32, DX
	ADDQ      $32, R8
	ADDQ      $32, DI
	DECQ      CX
	JNZ       lloop

ldone:
	VMOVUPS Y6, (BX)
	VMOVUPS Y7, 32(BX)
	VMOVUPS Y8, 64(BX)
	VZEROUPPER
	RET

// func errsAVX2(x, w *groups, laux *[32][8]int32, ts, tm *[8]float32, mad bool, n int, cur *[8]float32)
TEXT ·errsAVX2(SB), NOSPLIT, $0-64
	MOVQ x+0(FP), DX
	MOVQ w+8(FP), R8
	MOVQ laux+16(FP), DI
	MOVQ ts+24(FP), AX
	VMOVUPS (AX), Y0
	MOVQ tm+32(FP), AX
	VMOVUPS (AX), Y1
	BCAST(0x7fffffff, X2, Y2)
	MOVBLZX mad+40(FP), R9
	MOVQ n+48(FP), CX
	MOVQ cur+56(FP), BX
	VXORPS Y6, Y6, Y6
	TESTQ CX, CX
	JZ   edone
	TESTQ R9, R9
	JZ   esq

emad:
	VCVTDQ2PS (DI), Y9
	VMULPS    Y9, Y0, Y9 // ts·l
	VADDPS    Y1, Y9, Y9 // + tm
	VSUBPS    (DX), Y9, Y9 // - x
	VANDPS    Y2, Y9, Y9 // |diff|
	VMULPS    (R8), Y9, Y9 // w·|diff|
	VADDPS    Y9, Y6, Y6
	ADDQ      $32, DX
	ADDQ      $32, R8
	ADDQ      $32, DI
	DECQ      CX
	JNZ       emad
	JMP       edone

esq:
	VCVTDQ2PS (DI), Y9
	VMULPS    Y9, Y0, Y9
	VADDPS    Y1, Y9, Y9
	VSUBPS    (DX), Y9, Y9
	VMULPS    Y9, Y9, Y9 // diff²
	VMULPS    (R8), Y9, Y9
	VADDPS    Y9, Y6, Y6
	ADDQ      $32, DX
	ADDQ      $32, R8
	ADDQ      $32, DI
	DECQ      CX
	JNZ       esq

edone:
	VMOVUPS Y6, (BX)
	VZEROUPPER
	RET

// func symLevelsAVX2(x, w, wx *groups, iscale *[8]float32, lo, hi int32, n int, lv *[32][8]int32, sums *[2][8]float32)
TEXT ·symLevelsAVX2(SB), NOSPLIT, $0-64
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), R8
	MOVQ wx+16(FP), DX
	MOVQ iscale+24(FP), AX
	VMOVUPS (AX), Y0
	MOVL lo+32(FP), AX
	VMOVD AX, X5
	VPBROADCASTD X5, Y5
	MOVL hi+36(FP), AX
	VMOVD AX, X1
	VPBROADCASTD X1, Y1
	BCAST(0x4B400000, X2, Y2)
	BCAST(0x007fffff, X3, Y3)
	BCAST(0x00400000, X4, Y4)
	MOVQ n+40(FP), CX
	MOVQ lv+48(FP), DI
	MOVQ sums+56(FP), BX
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	TESTQ CX, CX
	JZ   sdone

sloop:
	VMULPS    (SI), Y0, Y9 // iscale·x
	VADDPS    Y2, Y9, Y9
	VPAND     Y3, Y9, Y9
	VPSUBD    Y4, Y9, Y9 // nearest_int
	VPMINSD   Y1, Y9, Y9
	VPMAXSD   Y5, Y9, Y9 // clamp to [lo, hi]
	VMOVDQU   Y9, (DI)
	VCVTDQ2PS Y9, Y10
	VMULPS    (DX), Y10, Y11 // (x²·x)·l
	VADDPS    Y11, Y6, Y6
	VMULPS    (R8), Y10, Y12 // (x²·l)
	VMULPS    Y10, Y12, Y12 // ·l
	VADDPS    Y12, Y7, Y7
	ADDQ      $32, SI
	ADDQ      $32, DX
	ADDQ      $32, R8
	ADDQ      $32, DI
	DECQ      CX
	JNZ       sloop

sdone:
	VMOVUPS Y6, (BX)
	VMOVUPS Y7, 32(BX)
	VZEROUPPER
	RET

// func signedMaxAVX2(x *groups, n int, xmax, amax *[8]float32)
// Per lane, the first value of largest magnitude and that magnitude:
// amax < |x| (an ordered compare: NaN never wins) selects the new pair.
TEXT ·signedMaxAVX2(SB), NOSPLIT, $0-32
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	BCAST(0x7fffffff, X5, Y5)
	VXORPS Y0, Y0, Y0 // amax
	VXORPS Y1, Y1, Y1 // xmax
	TESTQ CX, CX
	JZ   mdone

mloop:
	VMOVUPS   (SI), Y2
	VANDPS    Y5, Y2, Y3
	VCMPPS    $0x1e, Y0, Y3, Y4 // |x| > amax, ordered
	VBLENDVPS Y4, Y3, Y0, Y0
	VBLENDVPS Y4, Y2, Y1, Y1
	ADDQ      $32, SI
	DECQ      CX
	JNZ       mloop

mdone:
	MOVQ    xmax+16(FP), AX
	VMOVUPS Y1, (AX)
	MOVQ    amax+24(FP), AX
	VMOVUPS Y0, (AX)
	VZEROUPPER
	RET
