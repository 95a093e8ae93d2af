package mlxpack

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// FuzzParseCTConfig feeds arbitrary config.json bytes through the
// quantization_config parser: it must never panic, and whatever it accepts
// must be something MLX affine can express.
func FuzzParseCTConfig(f *testing.F) {
	f.Add([]byte(`{"quantization_config":{"quant_method":"compressed-tensors","format":"pack-quantized","config_groups":{"group_0":{"targets":["Linear"],"weights":{"num_bits":4,"type":"int","symmetric":true,"strategy":"group","group_size":32}}},"ignore":["lm_head","re:.*self_attn.*"]}}`))
	f.Add([]byte(`{"text_config":{"quantization_config":{"quant_method":"compressed-tensors","format":"mixed-precision","config_groups":{"a":{"format":"pack-quantized","targets":["re:.*mlp\\.down_proj$"],"weights":{"num_bits":8,"group_size":64}}}}}}`))
	f.Add([]byte(`{"quantization_config":{"quant_method":"awq"}}`))
	f.Add([]byte(`{"quantization_config":{"quant_method":"compressed-tensors","format":"pack-quantized","config_groups":{"g":{"targets":["re:(["],"weights":{"num_bits":4,"group_size":32}}}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := safetensors.ParseConfig(data, "config.json")
		if err != nil {
			return
		}
		qc, ok := quantizationConfig(cfg.Raw)
		if !ok {
			return
		}
		ct, err := ParseCTConfig(qc, "config.json")
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || !e.BadInput() {
				t.Fatalf("error %v (%T) is not a bad-input *Error", err, err)
			}
			return
		}
		if len(ct.Schemes) == 0 {
			t.Fatal("accepted a config without schemes")
		}
		for _, s := range ct.Schemes {
			if !mlxBits[s.Bits] || !mlxGS[s.GroupSize] || len(s.targets) == 0 {
				t.Fatalf("accepted scheme %+v", s)
			}
		}
		for _, name := range []string{"model.layers.0.mlp.down_proj", "lm_head", ""} {
			ct.Ignored(name)
			ct.SchemeFor(name)
		}
	})
}

// FuzzReadShape: a weight_shape tensor with arbitrary bytes and length is
// either refused with a bad-input error or yields positive dimensions.
func FuzzReadShape(f *testing.F) {
	ok := make([]byte, 16)
	binary.LittleEndian.PutUint64(ok, 32)
	binary.LittleEndian.PutUint64(ok[8:], 64)
	f.Add(ok, false)
	f.Add(ok[:8], false)
	f.Add([]byte{1, 0, 0, 0, 2, 0, 0, 0}, true)
	f.Add(bytes.Repeat([]byte{0xff}, 72), false)
	f.Fuzz(func(t *testing.T, data []byte, i32 bool) {
		dt, width := tensor.I64, 8
		if i32 {
			dt, width = tensor.I32, 4
		}
		n := int64(len(data) / width)
		data = data[:n*int64(width)]
		hdr, infos, err := safetensors.EncodeHeader(nil, []safetensors.TensorSpec{{Name: "m.weight_shape", DType: dt, Shape: []int64{n}}})
		if err != nil {
			t.Fatal(err)
		}
		file := append(hdr, data...)
		sf, err := safetensors.Parse(bytes.NewReader(file), int64(len(file)), "x.safetensors")
		if err != nil {
			t.Fatal(err)
		}
		shape, err := readShape(safetensors.Location{Shard: &safetensors.Shard{Name: "x.safetensors", File: sf}, Info: infos[0]})
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || !e.BadInput() {
				t.Fatalf("error %v is not a bad-input *Error", err)
			}
			return
		}
		if len(shape) < 2 || len(shape) > maxShapeDims {
			t.Fatalf("accepted %d dims", len(shape))
		}
		for _, d := range shape {
			if d <= 0 {
				t.Fatalf("accepted %v", shape)
			}
		}
	})
}

// FuzzFixedConfig feeds arbitrary config.json bytes through what mlx
// quantize makes of a config (its key order, FixedConfig, then mlxConfig
// with a quantization block and an MTP record): it must never panic, the output
// must be a JSON object that parses back, keep every key it did not mean
// to change, and carry the block.
func FuzzFixedConfig(f *testing.F) {
	f.Add([]byte(`{"architectures":["Qwen3ForCausalLM"],"model_type":"qwen3","rope_parameters":{"rope_theta":1000000.0,"rope_type":"default"},"tie_word_embeddings":true}`))
	f.Add([]byte(`{"model_type":"qwen3_5_text","mtp_num_hidden_layers":1,"rope_parameters":{"mrope_section":[6,5,5],"rope_theta":10000000.0,"rope_type":"default"}}`))
	f.Add([]byte(`{"model_type":"qwen3_5","text_config":{"model_type":"qwen3_5_text","mtp_num_hidden_layers":1,"rope_parameters":{"rope_type":"default"}},"vision_config":{"depth":2}}`))
	f.Add([]byte(`{"model_type":"llama","rope_parameters":{"rope_type":"llama3","factor":8.0,"rope_theta":500000}}`))
	f.Add([]byte(`{"model_type":"qwen3_next","rope_parameters":{"rope_theta":5e6,"partial_rotary_factor":0.25},"num_nextn_predict_layers":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := safetensors.ParseConfig(data, "config.json")
		if err != nil {
			return
		}
		fixed, _ := FixedConfig(cfg.Raw)
		order, err := keyOrderOf(data)
		if err != nil {
			t.Fatalf("ParseConfig read it, keyOrderOf did not: %v", err)
		}
		out, err := mlxConfig(fixed, configEdit{quant: map[string]any{"bits": 4, "group_size": 64, "mode": "affine"}, mtpDropped: 1, mtpTensors: 15, dropSaveKeys: true, order: order})
		if err != nil {
			t.Fatalf("mlxConfig: %v", err)
		}
		back, err := safetensors.ParseConfig(out, "out.json")
		if err != nil {
			t.Fatalf("output does not parse: %v\n%s", err, out)
		}
		for _, k := range []string{"quantization", "quantization_config", MTPRecordKey} {
			if _, ok := back.Raw[k]; !ok {
				t.Fatalf("output lacks %s", k)
			}
		}
		for k := range cfg.Raw {
			if _, ok := back.Raw[k]; !ok && k != "_name_or_path" && k != "vision_config" {
				t.Fatalf("key %q lost", k)
			}
		}
	})
}
