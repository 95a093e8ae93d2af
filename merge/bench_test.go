package merge

import (
	"fmt"
	"testing"
)

// BenchmarkLowRank measures the B·A kernel (the FMA chain PEFT's float32
// merge uses) on a row block of Qwen3.5-27B widths, rank 16.
func BenchmarkLowRank(b *testing.B) {
	for _, sz := range []struct {
		rows, cols, r int
		pureGo        bool
	}{{64, 5120, 16, false}, {16, 17408, 16, false}, {64, 5120, 8, false}, {64, 5120, 16, true}} {
		name := fmt.Sprintf("rows%d_cols%d_r%d", sz.rows, sz.cols, sz.r)
		if sz.pureGo {
			name += "_purego"
		}
		b.Run(name, func(b *testing.B) {
			forceGo = sz.pureGo
			defer func() { forceGo = false }()
			L := gen(1, "L", "F32", 0.1, int64(sz.rows), int64(sz.r)).vals
			R := gen(2, "R", "F32", 0.1, int64(sz.r), int64(sz.cols)).vals
			d := make([]float32, sz.rows*sz.cols)
			b.SetBytes(int64(sz.rows * sz.cols * 2)) // bf16 base bytes covered
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				lowRank(d, L, R, sz.rows, sz.r, sz.cols)
			}
			flops := 2 * float64(sz.rows) * float64(sz.cols) * float64(sz.r) * float64(b.N)
			b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
