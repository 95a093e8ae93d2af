package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/merge"
	"github.com/ferry-llm/ferry/mlxpack"
	"github.com/ferry-llm/ferry/pipeline"
)

// The typed states marshal to the strings the JSON outputs have always
// carried.
func TestTypedStatesMarshal(t *testing.T) {
	d := manifest.DigestOf([]byte("x"))
	tests := []struct {
		v    any
		want string
	}{
		{pipeline.StageReport{Action: pipeline.ActionNotSelected}, `"action":"not-selected"`},
		{pipeline.StageStatus{State: pipeline.StateNeverRun}, `"state":"never-run"`},
		{manifest.Record{Status: manifest.StatusComplete}, `"status":"complete"`},
		{merge.TensorOp{Op: merge.OpReplace}, `"op":"replace"`},
		{mlxpack.EntryResult{Kind: mlxpack.EntryShard, Action: mlxpack.ActionUnchanged}, `"kind":"shard"`},
		{mlxpack.EntryResult{Kind: mlxpack.EntryLink, Action: mlxpack.ActionCreated}, `"action":"created"`},
		{manifest.Output{Digest: d}, `"digest":"sha256:` + d.Hex() + `"`},
	}
	for _, tt := range tests {
		b, err := json.Marshal(tt.v)
		if err != nil || !strings.Contains(string(b), tt.want) {
			t.Errorf("%T: %s (%v), want %s", tt.v, b, err, tt.want)
		}
	}
	if f := (merge.FileDigest{SHA256: d.Hex()}); func() manifest.Digest { g, _ := f.Digest(); return g }() != d {
		t.Error("merge.FileDigest does not give back its digest")
	}
}
