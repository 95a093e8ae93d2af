package tensor

import "testing"

func TestParseDType(t *testing.T) {
	for in, want := range map[string]DType{
		"bf16": BF16, "BF16": BF16, "bfloat16": BF16, "f16": F16, "fp16": F16, "float16": F16, "half": F16,
		"f32": F32, "FP32": F32, "float32": F32, "F8_E4M3": F8_E4M3, "u32": U32, "float64": F64,
	} {
		if got, err := ParseDType(in); err != nil || got != want {
			t.Errorf("ParseDType(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "q4", "int4", "bf", "f16 "} {
		if got, err := ParseDType(in); err == nil {
			t.Errorf("ParseDType(%q) = %q, want an error", in, got)
		}
	}
}
