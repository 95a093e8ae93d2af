package testmodel_test

import (
	"fmt"
	"os"

	"github.com/ferry-llm/ferry/internal/testmodel"
)

func Example() {
	dir, _ := os.MkdirTemp("", "testmodel")
	defer os.RemoveAll(dir)
	m, err := testmodel.Qwen35Options{Common: testmodel.Common{Seed: 7}}.Write(dir + "/base")
	if err != nil {
		panic(err)
	}
	w, _ := m.Values("model.layers.3.self_attn.q_proj.weight") // as stored, as float32
	a, err := testmodel.AdapterOptions{R: 8, Alpha: 16, DoRA: true,
		TargetModules: []string{"q_proj", "v_proj", "in_proj_qkv"}}.Write(dir+"/dora", m)
	if err != nil {
		panic(err)
	}
	q, _ := a.Module("model.layers.3.self_attn.q_proj")
	fmt.Println(m.Architecture, len(m.Tensors), "tensors,", len(m.MTPNames()), "MTP,", len(m.Shards), "shards")
	fmt.Println(len(w), "q_proj values;", len(a.Modules), "adapted modules; q_proj scale", q.Scale, "keys", q.Magnitude)
	// Output:
	// Qwen3_5ForCausalLM 71 tensors, 15 MTP, 8 shards
	// 8192 q_proj values; 5 adapted modules; q_proj scale 2 keys base_model.model.model.layers.3.self_attn.q_proj.lora_magnitude_vector
}
