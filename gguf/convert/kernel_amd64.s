#include "textflag.h"

// func bf16ToF16AVX2(dst, src *uint16, n int, counts *[16]uint16)
// 16 values per iteration. Y10 = 0x7fff (magnitude mask), Y11 = 0x7f80
// (bfloat16 infinity), Y12 = 0x8000 (sign), Y13 = 0x7e00 (quiet NaN),
// Y14 = 0x7f7f (largest magnitude below infinity), all per 16-bit lane.
// Y6 counts, per lane, the source values that are NaN or ±Inf
// (magnitude > 0x7f7f): a compare gives -1 in such a lane, subtracted from
// the count; the caller keeps n/16 below 65536 so no lane wraps.
TEXT ·bf16ToF16AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ counts+24(FP), DX
	VPXOR Y6, Y6, Y6
	SHRQ $4, CX
	JZ   done
	MOVL $0x7fff7fff, AX
	MOVL AX, X10
	VPBROADCASTD X10, Y10
	MOVL $0x7f807f80, AX
	MOVL AX, X11
	VPBROADCASTD X11, Y11
	MOVL $0x80008000, AX
	MOVL AX, X12
	VPBROADCASTD X12, Y12
	MOVL $0x7e007e00, AX
	MOVL AX, X13
	VPBROADCASTD X13, Y13
	MOVL $0x7f7f7f7f, AX
	MOVL AX, X14
	VPBROADCASTD X14, Y14

loop:
	VPMOVZXWD (SI), Y0
	VPMOVZXWD 16(SI), Y1
	VPSLLD    $16, Y0, Y0
	VPSLLD    $16, Y1, Y1
	VCVTPS2PH $0, Y0, X0
	VCVTPS2PH $0, Y1, X1
	VINSERTI128 $1, X1, Y0, Y0
	VMOVDQU   (SI), Y2
	VPAND     Y10, Y2, Y3
	VPCMPGTW  Y14, Y3, Y5
	VPSUBW    Y5, Y6, Y6
	VPCMPGTW  Y11, Y3, Y3
	VPAND     Y12, Y2, Y4
	VPOR      Y13, Y4, Y4
	VPBLENDVB Y3, Y4, Y0, Y0
	VMOVDQU   Y0, (DI)
	ADDQ      $32, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       loop

done:
	VMOVDQU Y6, (DX)
	VZEROUPPER
	RET
