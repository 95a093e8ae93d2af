#include "textflag.h"

// AVX2 + FMA3 tiles of d = L·R: each element is the chain of fused
// multiply-adds over k = 0…r−1 starting from +0, exactly what the pure-Go
// path (lowRankGo) computes with its emulated float32 FMA.

// func tile4x16(d *float32, dstride int, l *float32, r int, rm *float32, rstride int, nblk int)
TEXT ·tile4x16(SB), NOSPLIT, $0-56
	MOVQ d+0(FP), DI
	MOVQ dstride+8(FP), R8
	SHLQ $2, R8
	MOVQ l+16(FP), SI
	MOVQ r+24(FP), R9
	MOVQ rm+32(FP), DX
	MOVQ rstride+40(FP), R10
	SHLQ $2, R10
	MOVQ nblk+48(FP), CX
	MOVQ R9, R11
	SHLQ $2, R11
	LEAQ (R11)(R11*2), R14

blk4:
	TESTQ CX, CX
	JZ done4
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	MOVQ DX, AX
	MOVQ SI, BX
	MOVQ R9, R12

k4:
	VMOVUPS (AX), Y8
	VMOVUPS 32(AX), Y9
	VBROADCASTSS (BX), Y10
	VFMADD231PS Y8, Y10, Y0
	VFMADD231PS Y9, Y10, Y1
	VBROADCASTSS (BX)(R11*1), Y11
	VFMADD231PS Y8, Y11, Y2
	VFMADD231PS Y9, Y11, Y3
	VBROADCASTSS (BX)(R11*2), Y12
	VFMADD231PS Y8, Y12, Y4
	VFMADD231PS Y9, Y12, Y5
	VBROADCASTSS (BX)(R14*1), Y13
	VFMADD231PS Y8, Y13, Y6
	VFMADD231PS Y9, Y13, Y7
	ADDQ R10, AX
	ADDQ $4, BX
	DECQ R12
	JNZ k4

	MOVQ DI, AX
	VMOVUPS Y0, (AX)
	VMOVUPS Y1, 32(AX)
	ADDQ R8, AX
	VMOVUPS Y2, (AX)
	VMOVUPS Y3, 32(AX)
	ADDQ R8, AX
	VMOVUPS Y4, (AX)
	VMOVUPS Y5, 32(AX)
	ADDQ R8, AX
	VMOVUPS Y6, (AX)
	VMOVUPS Y7, 32(AX)
	ADDQ $64, DI
	ADDQ $64, DX
	DECQ CX
	JMP blk4

done4:
	VZEROUPPER
	RET

// func tile1x16(d *float32, l *float32, r int, rm *float32, rstride int, nblk int)
TEXT ·tile1x16(SB), NOSPLIT, $0-48
	MOVQ d+0(FP), DI
	MOVQ l+8(FP), SI
	MOVQ r+16(FP), R9
	MOVQ rm+24(FP), DX
	MOVQ rstride+32(FP), R10
	SHLQ $2, R10
	MOVQ nblk+40(FP), CX

blk1:
	TESTQ CX, CX
	JZ done1
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	MOVQ DX, AX
	MOVQ SI, BX
	MOVQ R9, R12

k1:
	VBROADCASTSS (BX), Y10
	VFMADD231PS (AX), Y10, Y0
	VFMADD231PS 32(AX), Y10, Y1
	ADDQ R10, AX
	ADDQ $4, BX
	DECQ R12
	JNZ k1

	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	ADDQ $64, DI
	ADDQ $64, DX
	DECQ CX
	JMP blk1

done1:
	VZEROUPPER
	RET
