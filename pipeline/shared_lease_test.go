package pipeline_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/store"
	"github.com/ferry-llm/ferry/store/local"

	. "github.com/ferry-llm/ferry/pipeline"
)

// A stage that stops after taking its lease and before it runs (its
// planner fails once its fetched inputs are here) gives the lease back:
// other machines do not wait for it until this machine's run ends or the
// ttl runs out.
func TestSharedLeaseReleasedWhenPlanFails(t *testing.T) {
	shared := t.TempDir()
	head := "name: p\nstore: file://" + shared + "\nstages:\n  - name: a\n    synth: { size: 1MiB, units: 2, seed: 1 }\n"
	open := func(src string) *Spec {
		spec := loadSpec(t, t.TempDir(), src)
		spec.Store = filepath.Join(t.TempDir(), "cache")
		return spec
	}
	ctx := context.Background()
	// machine-a makes a; machine-b fetches it, so b's plan waits for
	// the run, and fails there.
	if _, err := Run(ctx, open(head), Options{Host: "machine-a", LeaseTTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	specB := open(head + "  - name: b\n    synth: { size: 1MiB, units: 2, seed: 2, from: a, fail_plan: \"planner says no\" }\n")
	rep, err := Run(ctx, specB, Options{Host: "machine-b", LeaseTTL: time.Minute})
	if err == nil || !strings.Contains(err.Error(), "planner says no") {
		t.Fatalf("run on machine-b: %v", err)
	}
	var key string
	for _, sr := range rep.Stages {
		switch sr.Stage {
		case "a":
			if sr.Action != ActionSkip || sr.Host != "machine-a" {
				t.Errorf("a on machine-b: %+v", sr)
			}
		case "b":
			key = sr.Key
		}
	}
	if key == "" {
		t.Fatalf("no key for b: %+v", rep.Stages)
	}
	b, err := local.New(shared)
	if err != nil {
		t.Fatal(err)
	}
	s, err := store.Open(ctx, b, store.Options{CacheDir: t.TempDir(), SkipProbe: true, Existing: true})
	if err != nil {
		t.Fatal(err)
	}
	li, _, live, err := s.LeaseStatus(ctx, "stage/"+key)
	if err != nil || live || !li.Released || li.Holder != "machine-b" {
		t.Errorf("b's lease after its plan failed: %+v live %v, %v", li, live, err)
	}
}
