package pipeline_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/pipeline/pipelinetest"
)

var update = flag.Bool("update", false, "re-pin testdata/kind-outputs.json: each stage kind's outputs in TestStageConformance at its Version")

// kindPinsFile pins, per stage kind, the digest of the outputs its
// TestStageConformance stage makes (small fixed inputs: the bundled tiny
// model, a generated compressed-tensors checkpoint, a golden GGUF) at the
// kind's Version. A kind's version is part of its stages' keys and ferry's
// release is not, so output bytes that change at the same version would
// be taken for the old ones by every store that holds them.
const kindPinsFile = "testdata/kind-outputs.json"

type kindPin struct {
	Version string          `json:"version"`
	Outputs manifest.Digest `json:"outputs"`
}

var kindPinsMu sync.Mutex

// checkKindPin fails when kind's outputs in the conformance run differ from
// the pinned ones at the same version (or -update re-pins them).
func checkKindPin(t *testing.T, kind string, got manifest.Digest) {
	t.Helper()
	k, ok := pipelinetest.Kinds().Lookup(kind)
	if !ok {
		t.Fatalf("no kind %q", kind)
	}
	kindPinsMu.Lock()
	defer kindPinsMu.Unlock()
	pins := map[string]kindPin{}
	b, err := os.ReadFile(kindPinsFile)
	if err == nil {
		err = json.Unmarshal(b, &pins)
	}
	if err != nil && !(*update && os.IsNotExist(err)) {
		t.Fatalf("%s: %v", kindPinsFile, err)
	}
	if *update {
		pins[kind] = kindPin{Version: k.Version, Outputs: got}
		b, err := json.MarshalIndent(pins, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(kindPinsFile, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	p, ok := pins[kind]
	switch {
	case !ok:
		t.Errorf("kind %s's outputs are not pinned in %s: pin them with go test ./pipeline -run 'TestStageConformance/%s$' -update", kind, kindPinsFile, kind)
	case p.Version == k.Version && p.Outputs != got:
		t.Errorf("kind %s's outputs changed: bump its Version in pipeline/registry.go and re-pin with -update (go test ./pipeline -run 'TestStageConformance/%s$' -update); pinned %s at version %s, got %s",
			kind, kind, p.Outputs.Short(), p.Version, got.Short())
	case p.Version != k.Version:
		t.Errorf("kind %s is at version %s, pinned at %s: re-pin with -update (go test ./pipeline -run 'TestStageConformance/%s$' -update)", kind, k.Version, p.Version, kind)
	}
}

// transferPinDigest is what a transfer's pin holds: its transfer record
// with what depends on the machine and the test's directories (where the
// files went, the remote hash tool, the network check) left out, so the
// pin sees the record's format and the files it lists.
func transferPinDigest(store *manifest.Store, outs []manifest.Output) (manifest.Digest, error) {
	if len(outs) != 1 {
		return "", fmt.Errorf("transfer outputs %v, want one record", outs)
	}
	b, err := os.ReadFile(store.BlobPath(outs[0].Digest))
	if err != nil {
		return "", err
	}
	var rec map[string]any
	if err := json.Unmarshal(b, &rec); err != nil {
		return "", err
	}
	dests, _ := rec["destinations"].([]any)
	for _, d := range dests {
		if m, ok := d.(map[string]any); ok {
			m["destination"], m["hash_command"] = "DEST", "HASH"
			delete(m, "netcheck")
		}
	}
	c, err := json.Marshal(rec)
	if err != nil {
		return "", err
	}
	return manifest.DigestOf(c), nil
}
