//go:build !ferry_synth

package main

import "github.com/ferry-llm/ferry/pipeline"

// stageKinds are the stage kinds pipeline files may name.
func stageKinds() *pipeline.Kinds { return pipeline.BuiltinKinds() }
