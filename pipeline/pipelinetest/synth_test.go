package pipelinetest

import (
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/pipeline"
)

// synth is known only to the kinds that add it, and its parameters are
// checked with the line they are on.
func TestSynthKind(t *testing.T) {
	const src = "name: x\nstages:\n  - name: a\n    synth: { size: %s }\n"
	for _, tc := range []struct {
		kinds *pipeline.Kinds
		size  string
		want  string // "" = parses
	}{
		{Kinds(), "10", ""},
		{Kinds(), "lots", `p.yaml:4: stage "a": synth.size: must be a size`},
		{Kinds(), "0", `synth.size: must be given and positive`},
		{pipeline.BuiltinKinds(), "10", `p.yaml:4: stage "a": unknown kind "synth"`},
	} {
		_, err := pipeline.Parse("p.yaml", "/p", []byte(strings.Replace(src, "%s", tc.size, 1)), pipeline.WithKinds(tc.kinds))
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("size %s: %v, want %q", tc.size, err, tc.want)
		}
	}
}
