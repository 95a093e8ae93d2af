package merge

import (
	"strings"
	"testing"
)

// A config whose target_modules match the MTP head (by suffix, as PEFT
// matches) gets one warning for the whole head, and it tells the user
// whether to act: on the bundled example (README's make demo) the DoRA
// adapter targets q/k/v/o and the MLP projections, so the head's seven
// modules match, and there is nothing to do. A model without a head gets
// no such warning.
func TestMTPHeadWarning(t *testing.T) {
	for _, tc := range []struct {
		name, base, adapter string
		want                string // "" for no MTP warning
	}{
		{"bundled qwen35-tiny + DoRA", "../testdata/models/qwen35-tiny/base", "../testdata/models/qwen35-tiny/adapter-dora",
			"config targets 7 MTP-head modules (mtp.layers.0.mlp.down_proj, mtp.layers.0.mlp.gate_proj, mtp.layers.0.mlp.up_proj, … (4 more)) " +
				"that the adapter has no weights for, as with every PEFT adapter of a model with an MTP head: transformers drops mtp.* when it loads the model, " +
				"so PEFT never saw them to train; nothing to do: the head is copied unchanged from the base and kept for speculative decoding (a PEFT merge drops it)"},
		{"qwen3, no MTP head", "testdata/reference/qwen3/base", "testdata/reference/qwen3/adapters/dora", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Inventory(tc.base, tc.adapter, PlanOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			var got []string
			for _, w := range p.Warnings {
				if strings.Contains(w, "MTP") || strings.Contains(w, "mtp.") {
					got = append(got, w)
				}
			}
			switch {
			case tc.want == "" && len(got) > 0:
				t.Errorf("MTP warnings %q, want none", got)
			case tc.want != "" && (len(got) != 1 || got[0] != tc.want):
				t.Errorf("MTP warnings %q,\nwant exactly %q", got, tc.want)
			}
		})
	}
}
