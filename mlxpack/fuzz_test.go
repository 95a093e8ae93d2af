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
