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

// One row of make_qkx2_quants' levels pass: l = clamp(nearest_int(iscale·
// (x - lo)), 0, nmax) stored at (DI) and Σ w·l, Σ (w·l)·l, Σ (w·l)·x
// into Y6, Y7, Y8. x at (DX), w at (R8); Y0 iscale, Y14 lo, Y15 1.5·2^23,
// Y3 and Y4 nearest_int's mask and bias, Y1 nmax, Y5 zero; Y9-Y13
// scratch. The pointers move on a row.
#define LEVELS_ROW \
	VMOVUPS   (DX), Y13; \
	VSUBPS    Y14, Y13, Y9; \
	VMULPS    Y9, Y0, Y9; \
	VADDPS    Y15, Y9, Y9; \
	VPAND     Y3, Y9, Y9; \
	VPSUBD    Y4, Y9, Y9; \
	VPMINSD   Y1, Y9, Y9; \
	VPMAXSD   Y5, Y9, Y9; \
	VMOVDQU   Y9, (DI); \
	VCVTDQ2PS Y9, Y10; \
	VMULPS    (R8), Y10, Y11; \
	VADDPS    Y11, Y6, Y6; \
	VMULPS    Y10, Y11, Y12; \
	VADDPS    Y12, Y7, Y7; \
	VMULPS    Y13, Y11, Y13; \
	VADDPS    Y13, Y8, Y8; \
	ADDQ      $32, DX; \
	ADDQ      $32, R8; \
	ADDQ      $32, DI

// One row of make_qkx2_quants' error pass: diff = ts·l + tm - x, then
// w·|diff| (ERR_ROW_MAD) or w·diff² (ERR_ROW_SQ) added into Y6. l at
// (DI), x at (DX), w at (R8); Y9 ts, Y10 tm, Y2 the abs mask; Y7 scratch.
#define ERR_ROW_MAD \
	VCVTDQ2PS (DI), Y7; \
	VMULPS    Y7, Y9, Y7; \
	VADDPS    Y10, Y7, Y7; \
	VSUBPS    (DX), Y7, Y7; \
	VANDPS    Y2, Y7, Y7; \
	VMULPS    (R8), Y7, Y7; \
	VADDPS    Y7, Y6, Y6; \
	ADDQ      $32, DX; \
	ADDQ      $32, R8; \
	ADDQ      $32, DI

#define ERR_ROW_SQ \
	VCVTDQ2PS (DI), Y7; \
	VMULPS    Y7, Y9, Y7; \
	VADDPS    Y10, Y7, Y7; \
	VSUBPS    (DX), Y7, Y7; \
	VMULPS    Y7, Y7, Y7; \
	VMULPS    (R8), Y7, Y7; \
	VADDPS    Y7, Y6, Y6; \
	ADDQ      $32, DX; \
	ADDQ      $32, R8; \
	ADDQ      $32, DI

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
	BCAST(0x4B400000, X15, Y15)
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
	LEVELS_ROW
	DECQ CX
	JNZ  lloop

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
	VMOVUPS (AX), Y9
	MOVQ tm+32(FP), AX
	VMOVUPS (AX), Y10
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
	ERR_ROW_MAD
	DECQ CX
	JNZ  emad
	JMP  edone

esq:
	ERR_ROW_SQ
	DECQ CX
	JNZ  esq

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

// func qkx2StepsAVX2(s *qkx2Lanes, x, w *groups, steps []float32, nmax int32, n int, mad bool, laux *[32][8]int32)
// qkx2StepsGo on eight lanes at once: each step is levelsAVX2's pass, the
// least-squares solve, errsAVX2's pass and the take, with the same
// operations in the same order per lane. A lane whose D is not positive
// computes a candidate too, but never takes it (the ok mask), as the Go
// form never looks at it. The state is read and written at the offsets of
// qkx2Lanes: sumW 0, sumX 32, hi 64, lo 96, rng 128, best 160, scale 192,
// useIscale 224, useMin 256.
TEXT ·qkx2StepsAVX2(SB), NOSPLIT, $0-80
	MOVQ s+0(FP), SI
	MOVQ x+8(FP), R10
	MOVQ w+16(FP), R11
	MOVQ steps_base+24(FP), R12
	MOVQ steps_len+32(FP), R13
	MOVL nmax+48(FP), AX
	VMOVD AX, X1
	VPBROADCASTD X1, Y1
	MOVQ n+56(FP), R14
	MOVBLZX mad+64(FP), R9
	MOVQ laux+72(FP), BX
	BCAST(0x4B400000, X15, Y15)
	BCAST(0x007fffff, X3, Y3)
	BCAST(0x00400000, X4, Y4)
	BCAST(0x7fffffff, X2, Y2)
	VPXOR Y5, Y5, Y5
	TESTQ R13, R13
	JZ   kdone
	TESTQ R14, R14
	JZ   kdone

kstep:
	VBROADCASTSS (R12), Y0
	VDIVPS  128(SI), Y0, Y0 // iscale = num / rng
	VMOVUPS 96(SI), Y14     // lo
	VXORPS  Y6, Y6, Y6
	VXORPS  Y7, Y7, Y7
	VXORPS  Y8, Y8, Y8
	MOVQ    R10, DX
	MOVQ    R11, R8
	MOVQ    BX, DI
	MOVQ    R14, CX

klev:
	LEVELS_ROW
	DECQ CX
	JNZ  klev

	// Y6 sumL, Y7 sumL2, Y8 sumXL.
	VMOVUPS   0(SI), Y9        // sumW
	VMOVUPS   32(SI), Y10      // sumX
	VMULPS    Y7, Y9, Y11      // sumW·sumL2
	VMULPS    Y6, Y6, Y12      // sumL·sumL
	VSUBPS    Y12, Y11, Y11    // D
	VCMPPS    $0x1e, Y5, Y11, Y13 // ok: D > 0, ordered
	VMULPS    Y8, Y9, Y9       // sumW·sumXL
	VMULPS    Y6, Y10, Y12     // sumX·sumL
	VSUBPS    Y12, Y9, Y9
	VDIVPS    Y11, Y9, Y9      // ts
	VMULPS    Y7, Y10, Y10     // sumL2·sumX
	VMULPS    Y8, Y6, Y12      // sumL·sumXL
	VSUBPS    Y12, Y10, Y10
	VDIVPS    Y11, Y10, Y10    // tm
	VCMPPS    $0x1e, Y5, Y10, Y11 // tm > 0, ordered
	VDIVPS    Y7, Y8, Y12      // sumXL / sumL2
	VBLENDVPS Y11, Y12, Y9, Y9 // ts
	VBLENDVPS Y11, Y5, Y10, Y10 // tm = +0

	// The error of the candidate (ts Y9, tm Y10) into Y6.
	VXORPS Y6, Y6, Y6
	MOVQ   R10, DX
	MOVQ   R11, R8
	MOVQ   BX, DI
	MOVQ   R14, CX
	TESTQ  R9, R9
	JZ     ksq

kmad:
	ERR_ROW_MAD
	DECQ CX
	JNZ  kmad
	JMP  ktake

ksq:
	ERR_ROW_SQ
	DECQ CX
	JNZ  ksq

ktake:
	VMOVUPS   160(SI), Y7          // best
	VCMPPS    $0x11, Y7, Y6, Y8    // cur < best, ordered
	VANDPS    Y13, Y8, Y8          // take = ok && cur < best
	VBLENDVPS Y8, Y6, Y7, Y7
	VMOVUPS   Y7, 160(SI)          // best
	VMOVUPS   224(SI), Y11
	VBLENDVPS Y8, Y0, Y11, Y11
	VMOVUPS   Y11, 224(SI)         // useIscale = iscale
	VMOVUPS   256(SI), Y11
	VBLENDVPS Y8, Y14, Y11, Y11
	VMOVUPS   Y11, 256(SI)         // useMin = lo (before the take)
	VMOVUPS   192(SI), Y11
	VBLENDVPS Y8, Y9, Y11, Y11
	VMOVUPS   Y11, 192(SI)         // scale = ts
	VBLENDVPS Y8, Y10, Y14, Y14
	VMOVUPS   Y14, 96(SI)          // lo = tm
	VMOVUPS   64(SI), Y11
	VSUBPS    Y14, Y11, Y11        // hi - lo
	VMOVUPS   128(SI), Y12
	VBLENDVPS Y8, Y11, Y12, Y12
	VMOVUPS   Y12, 128(SI)         // rng
	ADDQ      $4, R12
	DECQ      R13
	JNZ       kstep

kdone:
	VZEROUPPER
	RET

// func qkx2InitAVX2(x, w *groups, n int, s *qkx2Lanes)
// The first pass of make_qkx2_quants on eight lanes: min and max (VMINPS
// and VMAXPS with the new value first keep the old one unless the new is
// strictly beyond it, NaN never taken, as the Go form's compares), Σ w and
// Σ w·x from row 0 in index order, into s's sumW, sumX, hi and lo (lo not
// yet clamped to 0). n ≥ 1.
TEXT ·qkx2InitAVX2(SB), NOSPLIT, $0-32
	MOVQ x+0(FP), DX
	MOVQ w+8(FP), R8
	MOVQ n+16(FP), CX
	MOVQ s+24(FP), SI
	VMOVUPS (DX), Y0     // lo
	VMOVAPS Y0, Y1       // hi
	VMOVUPS (R8), Y2     // Σ w
	VMULPS  Y0, Y2, Y3   // Σ w·x
	DECQ    CX
	JZ      idone

iloop:
	ADDQ    $32, DX
	ADDQ    $32, R8
	VMOVUPS (DX), Y4
	VMOVUPS (R8), Y5
	VMINPS  Y0, Y4, Y0
	VMAXPS  Y1, Y4, Y1
	VADDPS  Y5, Y2, Y2
	VMULPS  Y4, Y5, Y6
	VADDPS  Y6, Y3, Y3
	DECQ    CX
	JNZ     iloop

idone:
	VMOVUPS Y2, 0(SI)
	VMOVUPS Y3, 32(SI)
	VMOVUPS Y1, 64(SI)
	VMOVUPS Y0, 96(SI)
	VZEROUPPER
	RET

// func qxStepsAVX2(s *qxLanes, x, w, wx *groups, nums *[18]float32)
// qxStepsGo on eight lanes at once: for each numerator, symLevelsAVX2's
// pass on 16 rows with levels in [-32, 31] (the levels are not kept: the
// taken ones are recomputed from useIscale) and the take, with the same
// operations in the same order per lane. The state is read and written at
// the offsets of qxLanes: xmax 0, scale 32, best 64, useIscale 96.
TEXT ·qxStepsAVX2(SB), NOSPLIT, $0-40
	MOVQ s+0(FP), SI
	MOVQ x+8(FP), R10
	MOVQ w+16(FP), R11
	MOVQ wx+24(FP), R12
	MOVQ nums+32(FP), R13
	BCAST(0x4B400000, X2, Y2)
	BCAST(0x007fffff, X3, Y3)
	BCAST(0x00400000, X4, Y4)
	BCAST(0xffffffe0, X5, Y5) // -32
	BCAST(31, X1, Y1)
	VXORPS Y15, Y15, Y15
	MOVQ   $18, BX

qstep:
	VBROADCASTSS (R13), Y0
	VDIVPS  0(SI), Y0, Y0 // iscale = num / xmax
	VXORPS  Y6, Y6, Y6
	VXORPS  Y7, Y7, Y7
	MOVQ    R10, DX
	MOVQ    R11, R8
	MOVQ    R12, DI
	MOVQ    $16, CX

qlev:
	VMULPS    (DX), Y0, Y9 // iscale·x
	VADDPS    Y2, Y9, Y9
	VPAND     Y3, Y9, Y9
	VPSUBD    Y4, Y9, Y9   // nearest_int
	VPMINSD   Y1, Y9, Y9
	VPMAXSD   Y5, Y9, Y9   // clamp to [-32, 31]
	VCVTDQ2PS Y9, Y10
	VMULPS    (DI), Y10, Y11 // (x²·x)·l
	VADDPS    Y11, Y6, Y6
	VMULPS    (R8), Y10, Y12 // (x²·l)
	VMULPS    Y10, Y12, Y12  // ·l
	VADDPS    Y12, Y7, Y7
	ADDQ      $32, DX
	ADDQ      $32, R8
	ADDQ      $32, DI
	DECQ      CX
	JNZ       qlev

	// Y6 Σlx, Y7 Σl²: take where Σl² > 0 and Σlx² > best·Σl².
	VMOVUPS   64(SI), Y13          // best
	VCMPPS    $0x1e, Y15, Y7, Y8   // Σl² > 0, ordered
	VMULPS    Y6, Y6, Y11          // Σlx·Σlx
	VMULPS    Y7, Y13, Y12         // best·Σl²
	VCMPPS    $0x1e, Y12, Y11, Y12 // >, ordered
	VANDPS    Y12, Y8, Y8
	VDIVPS    Y7, Y6, Y9           // scale = Σlx / Σl²
	VMULPS    Y6, Y9, Y10          // best = scale·Σlx
	VBLENDVPS Y8, Y10, Y13, Y13
	VMOVUPS   Y13, 64(SI)
	VMOVUPS   32(SI), Y11
	VBLENDVPS Y8, Y9, Y11, Y11
	VMOVUPS   Y11, 32(SI)
	VMOVUPS   96(SI), Y11
	VBLENDVPS Y8, Y0, Y11, Y11
	VMOVUPS   Y11, 96(SI)
	ADDQ      $4, R13
	DECQ      BX
	JNZ       qstep

	VZEROUPPER
	RET

// func divLevelsAVX2(x *float32, n int, add, d float32, doAdd bool, lo, hi, bias int32, out *byte)
// divLevelsGo on 8 values at a time: out[i] = byte(clamp(nearest_int((x[i]
// [+ add]) / d), lo, hi) + bias), the operations of the Go form in its
// order. n is a multiple of 8.
TEXT ·divLevelsAVX2(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSS add+16(FP), Y6
	VBROADCASTSS d+20(FP), Y7
	MOVBLZX doAdd+24(FP), R9
	MOVL lo+28(FP), AX
	VMOVD AX, X5
	VPBROADCASTD X5, Y5
	MOVL hi+32(FP), AX
	VMOVD AX, X1
	VPBROADCASTD X1, Y1
	MOVL bias+36(FP), AX
	VMOVD AX, X8
	VPBROADCASTD X8, Y8
	MOVQ out+40(FP), DI
	BCAST(0x4B400000, X2, Y2)
	BCAST(0x007fffff, X3, Y3)
	BCAST(0x00400000, X4, Y4)
	SHRQ $3, CX
	JZ   vdone

vloop:
	VMOVUPS (SI), Y0
	TESTQ   R9, R9
	JZ      vdiv
	VADDPS  Y6, Y0, Y0 // x + add

vdiv:
	VDIVPS    Y7, Y0, Y0 // / d
	VADDPS    Y2, Y0, Y0
	VPAND     Y3, Y0, Y0
	VPSUBD    Y4, Y0, Y0 // nearest_int
	VPMINSD   Y1, Y0, Y0
	VPMAXSD   Y5, Y0, Y0 // clamp to [lo, hi]
	VPADDD    Y8, Y0, Y0 // + bias
	VPACKSSDW Y0, Y0, Y0 // words: 0-3 0-3 | 4-7 4-7
	VPACKSSWB Y0, Y0, Y0 // bytes: 0-3 ×4 | 4-7 ×4
	VMOVD     X0, (DI)
	VEXTRACTI128 $1, Y0, X9
	VMOVD     X9, 4(DI)
	ADDQ      $32, SI
	ADDQ      $8, DI
	DECQ      CX
	JNZ       vloop

vdone:
	VZEROUPPER
	RET

// func loadAVX2(dst *groups, x *float32, n int)
// groups.load: 8 groups of n values (group k at x[n·k:]) transposed into
// g, eight rows at a time by an 8×8 transpose. n is 16 or 32.
TEXT ·loadAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ CX, DX
	SHLQ $2, DX // bytes per group
	SHRQ $3, CX // blocks of 8 rows

tloop:
	MOVQ SI, AX
	VMOVUPS (AX), Y0
	ADDQ    DX, AX
	VMOVUPS (AX), Y1
	ADDQ    DX, AX
	VMOVUPS (AX), Y2
	ADDQ    DX, AX
	VMOVUPS (AX), Y3
	ADDQ    DX, AX
	VMOVUPS (AX), Y4
	ADDQ    DX, AX
	VMOVUPS (AX), Y5
	ADDQ    DX, AX
	VMOVUPS (AX), Y6
	ADDQ    DX, AX
	VMOVUPS (AX), Y7
	VUNPCKLPS Y1, Y0, Y8
	VUNPCKHPS Y1, Y0, Y9
	VUNPCKLPS Y3, Y2, Y10
	VUNPCKHPS Y3, Y2, Y11
	VUNPCKLPS Y5, Y4, Y12
	VUNPCKHPS Y5, Y4, Y13
	VUNPCKLPS Y7, Y6, Y14
	VUNPCKHPS Y7, Y6, Y15
	VSHUFPS $0x44, Y10, Y8, Y0
	VSHUFPS $0xEE, Y10, Y8, Y1
	VSHUFPS $0x44, Y11, Y9, Y2
	VSHUFPS $0xEE, Y11, Y9, Y3
	VSHUFPS $0x44, Y14, Y12, Y4
	VSHUFPS $0xEE, Y14, Y12, Y5
	VSHUFPS $0x44, Y15, Y13, Y6
	VSHUFPS $0xEE, Y15, Y13, Y7
	VPERM2F128 $0x20, Y4, Y0, Y8
	VPERM2F128 $0x20, Y5, Y1, Y9
	VPERM2F128 $0x20, Y6, Y2, Y10
	VPERM2F128 $0x20, Y7, Y3, Y11
	VPERM2F128 $0x31, Y4, Y0, Y12
	VPERM2F128 $0x31, Y5, Y1, Y13
	VPERM2F128 $0x31, Y6, Y2, Y14
	VPERM2F128 $0x31, Y7, Y3, Y15
	VMOVUPS Y8, 0(DI)
	VMOVUPS Y9, 32(DI)
	VMOVUPS Y10, 64(DI)
	VMOVUPS Y11, 96(DI)
	VMOVUPS Y12, 128(DI)
	VMOVUPS Y13, 160(DI)
	VMOVUPS Y14, 192(DI)
	VMOVUPS Y15, 224(DI)
	ADDQ    $32, SI
	ADDQ    $256, DI
	DECQ    CX
	JNZ     tloop

	VZEROUPPER
	RET

// func squaresAVX2(x, w, wx *groups, n int)
// squaresGo on eight lanes: w = x·x, wx = w·x, row by row.
TEXT ·squaresAVX2(SB), NOSPLIT, $0-32
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), DI
	MOVQ wx+16(FP), DX
	MOVQ n+24(FP), CX
	TESTQ CX, CX
	JZ   qdone

qloop:
	VMOVUPS (SI), Y0
	VMULPS  Y0, Y0, Y1
	VMOVUPS Y1, (DI)
	VMULPS  Y0, Y1, Y2
	VMOVUPS Y2, (DX)
	ADDQ    $32, SI
	ADDQ    $32, DI
	ADDQ    $32, DX
	DECQ    CX
	JNZ     qloop

qdone:
	VZEROUPPER
	RET

// func k45WeightsAVX2(x, w *groups)
// k45WeightsGo on eight lanes: Σx² row by row, /32, √ (VSQRTPS is the
// correctly rounded float32 root, which the Go form's float64 root
// rounded to float32 also is), then w = av_x + |x|.
TEXT ·k45WeightsAVX2(SB), NOSPLIT, $0-16
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), DI
	VXORPS Y0, Y0, Y0
	MOVQ   SI, DX
	MOVQ   $32, CX

wsum:
	VMOVUPS (DX), Y1
	VMULPS  Y1, Y1, Y1
	VADDPS  Y1, Y0, Y0
	ADDQ    $32, DX
	DECQ    CX
	JNZ     wsum

	BCAST(0x42000000, X2, Y2) // 32.0
	VDIVPS  Y2, Y0, Y0
	VSQRTPS Y0, Y0
	BCAST(0x7fffffff, X3, Y3)
	MOVQ    $32, CX

wset:
	VANDPS  (SI), Y3, Y1
	VADDPS  Y1, Y0, Y1
	VMOVUPS Y1, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DI
	DECQ    CX
	JNZ     wset

	VZEROUPPER
	RET
