package convert

import "testing"

func TestParseOutType(t *testing.T) {
	for in, want := range map[string]OutType{"": OutF16, "f16": OutF16, "BF16": OutBF16, "f32": OutF32, "Q8_0": OutQ8_0, "auto": OutAuto} {
		if got, err := ParseOutType(in); err != nil || got != want {
			t.Errorf("ParseOutType(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"q4_k", "f8", "fp16"} {
		if _, err := ParseOutType(in); err == nil {
			t.Errorf("ParseOutType(%q): no error", in)
		}
	}
}
