package merge

import (
	"math"
	"os"
	"testing"
)

// FuzzAdapterConfig: ParseAdapterConfig never panics, and a config it
// accepts answers rank/alpha/target questions without panicking, with a
// positive rank and a finite scaling.
func FuzzAdapterConfig(f *testing.F) {
	for _, p := range []string{
		"testdata/reference/qwen3/adapters/dora/adapter_config.json",
		"testdata/reference/qwen3/adapters/rslora/adapter_config.json",
	} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"peft_type":"LORA","r":4,"lora_alpha":8,"target_modules":".*\\.(q|v)_proj","rank_pattern":{"q_proj":2},"alpha_pattern":{"layers\\.1\\..*":3}}`))
	f.Add([]byte(`{"r":8,"target_modules":["q_proj"],"layers_to_transform":[0,2],"layers_pattern":["layers","h"],"exclude_modules":"lm_head","modules_to_save":["score"]}`))
	f.Add([]byte(`{"r":8,"target_modules":"all-linear","use_rslora":true,"fan_in_fan_out":true,"bias":"all","lora_bias":true}`))
	names := []string{"model.layers.0.self_attn.q_proj", "model.layers.12.mlp.down_proj", "lm_head", "transformer.h.3.attn.c_attn", "q_proj"}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseAdapterConfig(data, "fuzz.json")
		if err != nil {
			return
		}
		for _, n := range names {
			r, _, s := c.RankAlpha(n)
			if r <= 0 || math.IsNaN(s) {
				t.Fatalf("%s: rank %d scaling %g", n, r, s)
			}
			c.Targets(n)
			c.SavesModule(n)
		}
	})
}
