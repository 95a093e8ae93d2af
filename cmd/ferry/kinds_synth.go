//go:build ferry_synth

package main

import (
	"github.com/ferry-llm/ferry/pipeline"
	"github.com/ferry-llm/ferry/pipeline/pipelinetest"
)

// stageKinds are the stage kinds pipeline files may name. This build is
// the one the pipeline CLI tests run (go build -tags ferry_synth): it adds
// the test-only synth kind, which ferry does not ship.
func stageKinds() *pipeline.Kinds { return pipelinetest.Kinds() }
