package verify

import (
	"reflect"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
)

// FindHead finds a head where MTP looks for one: Qwen's mtp.* under every
// prefix MTP knows, NextN layers past num_hidden_layers under the trunk's
// prefix, promised or not (MTP calls a head nothing promises inconsistent,
// and counts it: one definition).
func TestFindHead(t *testing.T) {
	cfg := func(js string) *safetensors.Config {
		c, err := safetensors.ParseConfig([]byte(js), "config.json")
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	tests := []struct {
		name  string
		names []string
		cfg   *safetensors.Config
		want  Head
	}{
		{"qwen top level", []string{"model.layers.0.x", "mtp.fc.weight", "mtp.layers.0.y"}, cfg(`{"mtp_num_hidden_layers":1}`),
			Head{Present: true, Tensors: 2, Promised: 1, PromisedBy: "mtp_num_hidden_layers"}},
		{"mlx sanitized", []string{"language_model.model.layers.0.x", "language_model.mtp.fc.weight"}, nil,
			Head{Present: true, Tensors: 1}},
		{"not a head: an adapter's module", []string{"base_model.model.mtp.fc.lora_A.weight"}, nil, Head{}},
		{"nextn under the trunk", []string{"model.language_model.layers.0.x", "model.language_model.layers.2.eh_proj.weight", "model.language_model.layers.2.enorm.weight"},
			cfg(`{"num_hidden_layers":2,"num_nextn_predict_layers":1}`),
			Head{Present: true, NextNLayers: []int{2}, NextNTensors: 2, Promised: 1, PromisedBy: "num_nextn_predict_layers"}},
		{"extra layers without the key", []string{"model.layers.0.x", "model.layers.1.x"}, cfg(`{"num_hidden_layers":1}`),
			Head{Present: true, NextNLayers: []int{1}, NextNTensors: 1}},
		{"promised, none there", []string{"model.layers.0.x"}, cfg(`{"num_hidden_layers":1,"num_nextn_predict_layers":1}`),
			Head{Promised: 1, PromisedBy: "num_nextn_predict_layers"}},
	}
	for _, tt := range tests {
		if got := FindHead(tt.names, tt.cfg); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: %+v, want %+v", tt.name, got, tt.want)
		}
	}
}
