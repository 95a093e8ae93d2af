package pipeline_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/store"
	"github.com/ferry-llm/ferry/store/local"
	"github.com/ferry-llm/ferry/store/storetest"

	. "github.com/ferry-llm/ferry/pipeline"
)

// A stage that stops after taking its lease and before it runs (its
// planner fails once its fetched inputs are here) gives the lease back:
// other machines do not wait for it until this machine's run ends or the
// ttl runs out.
func TestSharedLeaseReleasedWhenPlanFails(t *testing.T) {
	shared := t.TempDir()
	head := "name: p\nstore: file://" + shared + "\nstages:\n  - name: a\n    synth: { size: 1MiB, units: 2, seed: 1 }\n"
	open := func(src string) *Spec { return machineSpec(t, src) }
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
	s := openDirStore(t, shared, "")
	li, _, live, err := s.LeaseStatus(ctx, "stage/"+key)
	if err != nil || live || !li.Released || li.Holder != "machine-b" {
		t.Errorf("b's lease after its plan failed: %+v live %v, %v", li, live, err)
	}
}

// Status on a shared store says what the store holds of each stage: the
// record its ref names, who made it, whether it is this machine's, and a
// machine holding the lease of the stage's key.
func TestSharedStatus(t *testing.T) {
	shared, spec := twoStages(t)
	ctx := context.Background()
	cacheA, cacheB := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	rep, err := Run(ctx, spec(cacheA), Options{Host: "machine-a", Only: "a"})
	if err != nil {
		t.Fatal(err)
	}
	key := rep.Stages[0].Key
	status := func(cache string) map[string]StageStatus {
		t.Helper()
		sp := spec(cache)
		st, err := Status(sp)
		if err != nil {
			t.Fatal(err)
		}
		if err := SharedStatus(ctx, sp, st); err != nil {
			t.Fatal(err)
		}
		if st.Shared != "file://"+shared {
			t.Errorf("status: shared %q", st.Shared)
		}
		m := map[string]StageStatus{}
		for _, s := range st.Stages {
			m[s.Stage] = s
		}
		return m
	}
	if s := status(cacheA); s["a"].Shared == nil || !s["a"].Shared.Same || s["a"].Shared.Host != "machine-a" || s["b"].Shared != nil {
		t.Errorf("machine-a's status: a %+v, b %+v", s["a"].Shared, s["b"].Shared)
	}
	if s := status(cacheB)["a"]; s.State != StateNeverRun || s.Shared == nil || s.Shared.Same || s.Shared.Key != key || s.Shared.Host != "machine-a" {
		t.Errorf("machine-b's status of a: %s %+v", s.State, s.Shared)
	}
	// Someone holds a's lease (a forced run on machine-c).
	s := openDirStore(t, shared, "machine-c")
	l, err := s.AcquireLease(ctx, "stage/"+key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if sh := status(cacheB)["a"].Shared; sh == nil || sh.Making != "machine-c" || sh.Until == nil || time.Until(*sh.Until) <= 0 {
		t.Errorf("status while machine-c holds a's lease: %+v", sh)
	}
}

// A stage made here but not in the shared store (a run killed before it
// shared it, a store seeded late) is shared by a run that takes it as an
// input from outside its selection (--only), so that no other machine
// makes it again.
func TestSharedOutsideInputShared(t *testing.T) {
	shared, cache := t.TempDir(), filepath.Join(t.TempDir(), "cache")
	stages := "stages:\n  - name: a\n    synth: { size: 1MiB, units: 2, seed: 1 }\n  - name: b\n    synth: { size: 1MiB, units: 2, seed: 2, from: a }\n"
	ctx := context.Background()
	alone := loadSpec(t, t.TempDir(), "name: p\nstore: "+cache+"\n"+stages)
	rep, err := Run(ctx, alone, Options{Host: "machine-a", Only: "a"})
	if err != nil {
		t.Fatal(err)
	}
	keyA := rep.Stages[0].Key
	spec := loadSpec(t, t.TempDir(), "name: p\nstore: file://"+shared+"\n"+stages)
	spec.Store = cache
	if _, err := Run(ctx, spec, Options{Host: "machine-a", Only: "b"}); err != nil {
		t.Fatal(err)
	}
	s := openDirStore(t, shared, "")
	if r, err := s.Record(ctx, keyA); err != nil || r.Host != "machine-a" {
		t.Fatalf("a in the shared store after a run of --only b: %+v, %v", r, err)
	}
	if ref, err := s.GetRef(ctx, "pipelines/p/a"); err != nil || ref.Value != keyA {
		t.Errorf("a's ref: %+v, %v", ref, err)
	}
}

// openDirStore opens the shared store in dir as machine host.
func openDirStore(t *testing.T, dir, host string) *store.Store {
	t.Helper()
	b, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := store.Open(context.Background(), b, store.Options{CacheDir: t.TempDir(), SkipProbe: true, Host: host})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A blob damaged in the shared store: the machine that fetches it stops
// with an error that says how to repair it (it is create-only: storing
// it again would keep the damaged one), nothing of it is kept; once
// verify's repair has removed it, the next run makes the stage again and
// stores it whole.
func TestSharedDamagedBlob(t *testing.T) {
	shared := t.TempDir()
	src := "name: p\nstore: file://" + shared + "\nstages:\n  - name: a\n    synth: { size: 1MiB, units: 2, seed: 1 }\n"
	open := func() *Spec { return machineSpec(t, src) }
	ctx := context.Background()
	specA := open()
	rep, err := Run(ctx, specA, Options{Host: "machine-a"})
	if err != nil {
		t.Fatal(err)
	}
	s := openDirStore(t, shared, "")
	rec, err := s.Record(ctx, rep.Stages[0].Key)
	if err != nil || len(rec.Outputs) == 0 {
		t.Fatalf("a's record: %+v, %v", rec, err)
	}
	blob := filepath.Join(shared, filepath.FromSlash(store.BlobKey(rec.Outputs[0].Digest)))
	storetest.DamageFile(t, blob)

	// The machine that fetches it finds it damaged twice, removes it
	// and makes the stage again, which stores it again; it says so.
	var logs bytes.Buffer
	rep, err = Run(ctx, open(), Options{Host: "machine-b", Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil || rep.Stages[0].Action != ActionRun {
		t.Fatalf("run on a damaged blob: %+v, %v", rep, err)
	}
	if !strings.Contains(logs.String(), "damaged in the shared store (read twice, the same wrong bytes): removed") || len(rep.Stages[0].Warnings) != 1 {
		t.Errorf("no warning of the damaged blob removed (%q):\n%s", rep.Stages[0].Warnings, logs.String())
	}
	if vr, err := s.Verify(ctx, nil); err != nil || !vr.OK() {
		t.Errorf("verify after the stage was made again: %+v, %v", vr, err)
	}
	rep, err = Run(ctx, open(), Options{Host: "machine-c"})
	if err != nil || rep.Stages[0].Action != ActionSkip || rep.Stages[0].Host != "machine-a" {
		t.Fatalf("run after the blob was stored again: %+v, %v", rep.Stages, err)
	}
	// Repaired again; this time the machine that made it, its outputs
	// whole in its cache, runs: up to date here, it stores the blob
	// again (no other machine need make the stage).
	storetest.DamageFile(t, blob)
	if vr, err := s.VerifyWith(ctx, store.VerifyOptions{Repair: true}); err != nil || len(vr.Problems) != 1 || !vr.Problems[0].Removed {
		t.Fatalf("repair: %+v, %v", vr, err)
	}
	rep, err = Run(ctx, specA, Options{Host: "machine-a"})
	if err != nil || rep.Stages[0].Action != ActionSkip {
		t.Fatalf("machine-a after the repair: %+v, %v", rep.Stages, err)
	}
	if vr, err := s.Verify(ctx, nil); err != nil || !vr.OK() {
		t.Errorf("verify after machine-a's run: %+v, %v", vr, err)
	}
}

// A pipeline's own store directory is not a shared store: named as one
// (file://) by another machine, it is refused before anything is
// written there (its owner's gc would prune the other machine's records).
func TestSharedRefusesPipelineStore(t *testing.T) {
	own := filepath.Join(t.TempDir(), ".ferry")
	stages := "stages:\n  - name: a\n    synth: { size: 1MiB, units: 2, seed: 1 }\n"
	ctx := context.Background()
	if _, err := Run(ctx, loadSpec(t, t.TempDir(), "name: p\nstore: "+own+"\n"+stages), Options{}); err != nil {
		t.Fatal(err)
	}
	before := dirTree(t, own)
	spec := machineSpec(t, "name: p\nstore: file://"+own+"\n"+stages)
	_, err := Run(ctx, spec, Options{Host: "machine-b"})
	if errkind.Of(err) != errkind.Usage || !strings.Contains(err.Error(), "is a pipeline's own store (it has manifest.json)") {
		t.Fatalf("run on another machine's pipeline store: %v", err)
	}
	if after := dirTree(t, own); after != before {
		t.Errorf("the pipeline's store changed:\n%s\nafter:\n%s", before, after)
	}
}

// twoStages is a shared directory store and a pipeline of two synth
// stages on it, loaded with a machine's cache.
func twoStages(t *testing.T) (string, func(cache string) *Spec) {
	shared := t.TempDir()
	src := "name: p\nstore: file://" + shared + "\nstages:\n  - name: a\n    synth: { size: 1MiB, units: 2, seed: 1 }\n  - name: b\n    synth: { size: 1MiB, units: 2, seed: 2 }\n"
	return shared, func(cache string) *Spec {
		s := loadSpec(t, t.TempDir(), src)
		s.Store = cache
		return s
	}
}

// dirTree lists every path under dir with its size.
func dirTree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %d\n", p, fi.Size())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// A stage whose ref in the shared store names no record it holds (written
// by hand, its record deleted) is that stage's problem in status; the
// other stages are still told, and a run on another machine makes the
// stage (the ref is as if absent) and points the ref again.
func TestSharedBrokenRef(t *testing.T) {
	shared, spec := twoStages(t)
	ctx := context.Background()
	if _, err := Run(ctx, spec(filepath.Join(t.TempDir(), "a")), Options{Host: "machine-a"}); err != nil {
		t.Fatal(err)
	}
	s := openDirStore(t, shared, "")
	ref, err := s.GetRef(ctx, "pipelines/p/a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetRef(ctx, "pipelines/p/a", "no-such-record", &ref); err != nil {
		t.Fatal(err)
	}
	cacheB := filepath.Join(t.TempDir(), "b")
	sp := spec(cacheB)
	st, err := Status(sp)
	if err != nil {
		t.Fatal(err)
	}
	if err := SharedStatus(ctx, sp, st); err != nil {
		t.Fatalf("status with one broken ref: %v", err)
	}
	for _, ss := range st.Stages {
		switch {
		case ss.Stage == "a" && (ss.Shared == nil || !strings.Contains(ss.Shared.Problem, "names record no-such-record, which is not in the store")):
			t.Errorf("a: %+v", ss.Shared)
		case ss.Stage == "b" && (ss.Shared == nil || ss.Shared.Host != "machine-a" || ss.Shared.Problem != ""):
			t.Errorf("b: %+v", ss.Shared)
		}
	}
	if vr, err := s.Verify(ctx, nil); err != nil || len(vr.Problems) != 1 || vr.Problems[0].Ref != "pipelines/p/a" {
		t.Errorf("verify: %+v, %v", vr, err)
	}
	// The record of a's key is there: machine-b skips a (its key's
	// record) and points the ref again.
	if _, err := Run(ctx, spec(cacheB), Options{Host: "machine-b"}); err != nil {
		t.Fatal(err)
	}
	if vr, err := s.Verify(ctx, nil); err != nil || !vr.OK() {
		t.Errorf("verify after a run: %+v, %v", vr, err)
	}
}

// --only on a shared store takes the inputs outside the selection that
// this file gives them (their keys, from its parameters and inputs), not
// whatever the stage's ref names: the latest run on any machine, here of
// a file whose stage b has other parameters.
func TestSharedOnlyTakesThisFilesInputs(t *testing.T) {
	shared := t.TempDir()
	fileA := func(seedA, seedB int) string {
		return "name: p\nstore: file://" + shared + "\nstages:\n" +
			fmt.Sprintf("  - name: a\n    synth: { size: 1MiB, units: 2, seed: %d }\n", seedA) +
			fmt.Sprintf("  - name: b\n    synth: { size: 1MiB, units: 2, seed: %d, from: a }\n", seedB) +
			"  - name: c\n    synth: { size: 1MiB, units: 2, seed: 3, from: b }\n"
	}
	file := func(seedB int) string { return fileA(1, seedB) }
	open := func(src string) *Spec { return machineSpec(t, src) }
	ctx := context.Background()
	team, err := Run(ctx, open(file(2)), Options{Host: "team"})
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	for _, sr := range team.Stages {
		keys[sr.Stage] = sr.Key
	}
	// Another file of the same pipeline name, b with another seed: b's
	// ref now names its record, and the run warns that the files
	// disagree.
	var logs bytes.Buffer
	if _, err := Run(ctx, open(file(7)), Options{Host: "other", Log: slog.New(slog.NewTextHandler(&logs, nil))}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "another machine made this stage of this pipeline's name with other parameters") || !strings.Contains(logs.String(), "stage=b made_on=team") {
		t.Errorf("no warning that two files disagree:\n%s", logs.String())
	}
	// The same machine after an edit of its file: no warning.
	logs.Reset()
	edited := open(file(8))
	edited.Store = filepath.Join(t.TempDir(), "other-cache")
	for _, seed := range []int{7, 8} {
		sp := open(file(seed))
		sp.Store = edited.Store
		if _, err := Run(ctx, sp, Options{Host: "other", Log: slog.New(slog.NewTextHandler(&logs, nil))}); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Contains(logs.String(), "with other parameters") {
		t.Errorf("a warning after an edit on one machine:\n%s", logs.String())
	}
	rep, err := Run(ctx, open(file(2)), Options{Host: "mac", Only: "c"})
	if err != nil {
		t.Fatal(err)
	}
	for _, sr := range rep.Stages {
		if sr.Stage == "c" && (sr.Action != ActionSkip || sr.Key != keys["c"] || sr.Host != "team") {
			t.Errorf("c on mac with the team's file: %s %s (%s), key %.12s, want the team's %.12s", sr.Action, sr.Host, sr.Reason, sr.Key, keys["c"])
		}
	}
	// The same on a plan.
	pr, err := Plan(open(file(2)), Options{Host: "mac", Only: "c"})
	if err != nil {
		t.Fatal(err)
	}
	for _, sr := range pr.Stages {
		if sr.Stage == "b" && (sr.Key != keys["b"] || sr.Host != "team") {
			t.Errorf("plan: b %+v, want the team's key %.12s", sr, keys["b"])
		}
	}
	// A file whose b no machine made: refused, saying why, not run on
	// another file's b.
	_, err = Run(ctx, open(file(9)), Options{Host: "mac", Only: "c"})
	if err == nil || !strings.Contains(err.Error(), "stage b has not run with this file's parameters and inputs") || !strings.Contains(err.Error(), "was made with other parameters") {
		t.Errorf("--only c with a b no machine made: %v", err)
	}
	// Nor with an a no machine made, two stages up: b and c there were
	// made from another a.
	_, err = Run(ctx, open(fileA(5, 2)), Options{Host: "mac", Only: "c"})
	if err == nil || !strings.Contains(err.Error(), "stage b reads a: stage a has not run with this file's parameters and inputs") {
		t.Errorf("--only c with an a no machine made: %v", err)
	}
	pr, err = Plan(open(fileA(5, 2)), Options{Host: "mac", Only: "c"})
	if err != nil {
		t.Fatal(err)
	}
	for _, sr := range pr.Stages {
		if sr.Stage == "c" && sr.Action != ActionBlocked {
			t.Errorf("plan with an a no machine made: c %s (%s)", sr.Action, sr.Reason)
		}
	}
}

// sharedAB is a shared directory store where team made a of the file
// src (stages a, then b from a), and open, src on a machine of its own.
func sharedAB(t *testing.T) (shared, src string, open func() *Spec) {
	t.Helper()
	shared = t.TempDir()
	src = "name: p\nstore: file://" + shared + "\nstages:\n" +
		"  - name: a\n    synth: { size: 1MiB, units: 2, seed: 1 }\n" +
		"  - name: b\n    synth: { size: 1MiB, units: 2, seed: 2, from: a }\n"
	open = func() *Spec { return machineSpec(t, src) }
	if _, err := Run(context.Background(), open(), Options{Host: "team", Only: "a"}); err != nil {
		t.Fatal(err)
	}
	return shared, src, open
}

// --only whose input another machine is making (its lease held): the run
// waits, telling who makes it, and goes on when the lease ends (here
// without a record: then it says that no machine made it).
func TestSharedOnlyWaitsForInputBeingMade(t *testing.T) {
	shared, src, open := sharedAB(t)
	ctx := context.Background()
	s := openDirStore(t, shared, "machine-x")
	// b's key, as this file gives it: a's record in the store.
	pr, err := Plan(open(), Options{Host: "mac", Only: "b"})
	if err != nil {
		t.Fatal(err)
	}
	var keyB string
	for _, sr := range pr.Stages {
		if sr.Stage == "b" {
			keyB = sr.Key
		}
	}
	if keyB == "" {
		t.Fatalf("no key for b: %+v", pr.Stages)
	}
	l, err := s.AcquireLease(ctx, "stage/"+keyB, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan Event, 16)
	done := make(chan error, 1)
	spec := machineSpec(t, src+"  - name: c\n    synth: { size: 1MiB, units: 2, seed: 3, from: b }\n")
	// plan says what a run does: it waits.
	pr, err = Plan(spec, Options{Host: "mac", Only: "c"})
	if err != nil {
		t.Fatal(err)
	}
	for _, sr := range pr.Stages {
		if sr.Stage == "c" && (sr.Action != ActionPending || !strings.Contains(sr.Reason, "stage b is being made on machine-x") || !strings.Contains(sr.Reason, "a run waits for it")) {
			t.Errorf("plan while b is being made: c %s (%s)", sr.Action, sr.Reason)
		}
	}
	go func() {
		_, err := Run(ctx, spec, Options{Host: "mac", Only: "c", Events: func(e Event) {
			if e.Event == EventWaiting {
				waiting <- e
			}
		}})
		done <- err
	}()
	select {
	case e := <-waiting:
		if e.Stage != "b" || e.Holder != "machine-x" {
			t.Errorf("waiting event: %+v", e)
		}
	case err := <-done:
		t.Fatalf("the run did not wait for b: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("no waiting event")
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "stage b has not run with this file's parameters and inputs") {
			t.Errorf("after the lease ended without a record: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the run did not go on when the lease ended")
	}
}

// A machine that loses its stage's lease while the stage runs (paused
// past the ttl: here the lease is replaced behind its back, as a takeover
// does) does not fail the run: it waits for the machine that took the
// stage, then fetches the record, or takes the lease back and resumes.
// Both machines' runs end well and the store holds the stage once.
func TestSharedLeaseLostWhileRunning(t *testing.T) {
	shared := t.TempDir()
	src := "name: p\nstore: file://" + shared + "\nstages:\n  - name: a\n    synth: { size: 4MiB, units: 20, seed: 1, pace: 100ms }\n"
	open := func() *Spec { return machineSpec(t, src) }
	ctx := context.Background()
	pr, err := Plan(open(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	key := pr.Stages[0].Key
	done := make(chan error, 1)
	var rep *Report
	go func() {
		var err error
		rep, err = Run(ctx, open(), Options{Host: "machine-a", LeaseTTL: time.Second})
		done <- err
	}()
	s := openDirStore(t, shared, "")
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, _, live, err := s.LeaseStatus(ctx, "stage/"+key); err == nil && live {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("machine-a never held the stage's lease")
		}
	}
	time.Sleep(300 * time.Millisecond) // a few units in
	// Released by someone else: machine-a's next renewal finds it lost.
	if _, err := s.Backend().Put(ctx, "leases/stage/"+key, []byte(`{"holder":"machine-b","id":"forged","ttl_ms":1000,"seq":9,"released":true}`), store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	repB, errB := Run(ctx, open(), Options{Host: "machine-b", LeaseTTL: time.Second})
	if errB != nil {
		t.Fatalf("machine-b: %v", errB)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("machine-a, its lease lost while running: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("machine-a did not finish")
	}
	a, b := rep.Stages[0], repB.Stages[0]
	if a.Key != key || b.Key != key || (a.Action == ActionRun) == (b.Action == ActionRun) {
		t.Errorf("machine-a %s (%s), machine-b %s (%s): want one made it, the other fetched it", a.Action, a.Reason, b.Action, b.Reason)
	}
	if vr, err := s.Verify(ctx, nil); err != nil || !vr.OK() || vr.Records != 1 {
		t.Errorf("verify: %+v, %v", vr, err)
	}
}

// A gc pruning records that read the refs before a machine pointed a ref
// at an old record may remove it: the machine waits for the gc to end,
// finds the record gone, and shares it again from what it fetched.
func TestSharedRefPointedAtPrunedRecord(t *testing.T) {
	shared := t.TempDir()
	src := "name: p\nstore: file://" + shared + "\nstages:\n  - name: a\n    synth: { size: 1MiB, units: 2, seed: 1 }\n"
	ctx := context.Background()
	specA := loadSpec(t, t.TempDir(), src)
	specA.Store = filepath.Join(t.TempDir(), "a")
	rep, err := Run(ctx, specA, Options{Host: "machine-a"})
	if err != nil {
		t.Fatal(err)
	}
	key, blob := rep.Stages[0].Key, rep.Stages[0].Outputs[0].Digest
	s := openDirStore(t, shared, "gc-machine")
	gc, err := s.AcquireLease(ctx, "gc", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	specB := loadSpec(t, t.TempDir(), src)
	specB.Store = filepath.Join(t.TempDir(), "b")
	done := make(chan error, 1)
	var repB *Report
	go func() {
		var err error
		repB, err = Run(ctx, specB, Options{Host: "machine-b"})
		done <- err
	}()
	// Once machine-b has fetched the blob, it points the ref and waits
	// for the gc: the gc removes the record, as a prune does, and ends.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(specB.Store, "blobs", "sha256", blob.Hex())); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("machine-b never fetched the blob")
		}
	}
	time.Sleep(200 * time.Millisecond)
	if err := s.Backend().Delete(ctx, "records/"+key+".json", ""); err != nil {
		t.Fatal(err)
	}
	if err := gc.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("machine-b did not finish")
	}
	if a := repB.Stages[0]; a.Action != ActionSkip || a.Host != "machine-a" {
		t.Errorf("machine-b: %s (%s), want it fetched", a.Action, a.Reason)
	}
	if _, err := s.Record(ctx, key); err != nil {
		t.Errorf("the pruned record was not shared again: %v", err)
	}
	if vr, err := s.Verify(ctx, nil); err != nil || !vr.OK() {
		t.Errorf("verify: %+v, %v", vr, err)
	}
}

// --only on a machine whose import's files are here but not imported yet
// refuses (their bytes decide every key after them) instead of taking
// what the stage's ref names, made maybe from other files; a machine
// without those files takes the ref's record, made with this file's
// parameters.
func TestSharedOnlyImportFilesHere(t *testing.T) {
	shared := t.TempDir()
	file := func(data string) string {
		dir := t.TempDir()
		src := filepath.Join(dir, "w.bin")
		if data != "" {
			if err := os.WriteFile(src, []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return "name: p\nstore: file://" + shared + "\nstages:\n" +
			"  - name: base\n    import: { path: " + src + " }\n" +
			"  - name: b\n    synth: { size: 1MiB, units: 2, seed: 2, from: base }\n" +
			"  - name: c\n    synth: { size: 1MiB, units: 2, seed: 3, from: b }\n"
	}
	open := func(src string) *Spec { return machineSpec(t, src) }
	ctx := context.Background()
	if _, err := Run(ctx, open(file("the team's base")), Options{Host: "team"}); err != nil {
		t.Fatal(err)
	}
	_, err := Run(ctx, open(file("another base")), Options{Host: "gpu2", Only: "c"})
	if err == nil || !strings.Contains(err.Error(), "stage b reads base: stage base has not run yet") {
		t.Errorf("--only c with other base files here, not imported: %v", err)
	}
	rep, err := Run(ctx, open(file("")), Options{Host: "mac", Only: "c"})
	if err != nil {
		t.Fatalf("--only c on a machine without the base files: %v", err)
	}
	for _, sr := range rep.Stages {
		if sr.Stage == "c" && (sr.Action != ActionSkip || sr.Host != "team") {
			t.Errorf("mac: c %s (%s)", sr.Action, sr.Reason)
		}
	}
}

// A stage whose lease is lost while it is being shared (this machine
// paused past the ttl: here the lease is replaced before the upload
// starts, and the holder has noticed) waits for the lease, shares it
// under the lease regained, and the run ends well, nothing NOT SHARED.
func TestSharedLeaseLostWhileSharing(t *testing.T) {
	shared := t.TempDir()
	src := "name: p\nstore: file://" + shared + "\nstages:\n  - name: a\n    synth: { size: 1MiB, units: 2, seed: 1 }\n"
	spec := machineSpec(t, src)
	ctx := context.Background()
	s := openDirStore(t, shared, "")
	var logs bytes.Buffer
	var mu sync.Mutex
	BeforeShare(func(stage string) {
		mu.Lock()
		defer mu.Unlock()
		var names []string
		s.Backend().List(ctx, "leases/stage/", func(in store.Info) error { names = append(names, in.Key); return nil })
		for _, k := range names {
			s.Backend().Put(ctx, k, []byte(`{"holder":"machine-b","id":"forged","ttl_ms":1000,"seq":9,"released":true}`), store.PutOptions{})
		}
		time.Sleep(1500 * time.Millisecond) // past a renewal: the holder knows
	})
	defer BeforeShare(nil)
	rep, err := Run(ctx, spec, Options{Host: "machine-a", LeaseTTL: time.Second, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, logs.String())
	}
	if sr := rep.Stages[0]; sr.Action != ActionRun || sr.NotShared != "" {
		t.Errorf("a: %s, not shared %q", sr.Action, sr.NotShared)
	}
	if !strings.Contains(logs.String(), "stage lease lost while sharing") {
		t.Errorf("the lease was not lost while sharing:\n%s", logs.String())
	}
	if vr, err := s.Verify(ctx, nil); err != nil || !vr.OK() || vr.Records != 1 {
		t.Errorf("verify: %+v, %v", vr, err)
	}
}

// runResult is the end of a run started in a goroutine.
type runResult struct {
	rep *Report
	err error
}

// reportKey is stage's key in rep ("" if none).
func reportKey(rep *Report, stage string) string { return stageOf(rep, stage).Key }

// stageOf is stage's report in rep (empty if none).
func stageOf(rep *Report, stage string) StageReport {
	if rep != nil {
		for _, sr := range rep.Stages {
			if sr.Stage == stage {
				return sr
			}
		}
	}
	return StageReport{}
}

// madeAndShared fails t unless stage ran in rep and was shared; its report.
func madeAndShared(t *testing.T, rep *Report, stage string) StageReport {
	t.Helper()
	sr := stageOf(rep, stage)
	if sr.Action != ActionRun || sr.NotShared != "" {
		t.Fatalf("%s: %s, not shared: %q", stage, sr.Action, sr.NotShared)
	}
	return sr
}

// macWaitsForB starts the mac's --only c run of spec and checks that it
// waits for the team's b (why: what the team is doing), not takes old's.
func macWaitsForB(t *testing.T, spec *Spec, old *Report, why string) chan runResult {
	t.Helper()
	waiting := make(chan Event, 16)
	mac := make(chan runResult, 1)
	go func() {
		rep, err := Run(context.Background(), spec, Options{Host: "mac", Only: "c", Events: func(e Event) {
			if e.Event == EventWaiting {
				waiting <- e
			}
		}})
		mac <- runResult{rep, err}
	}()
	select {
	case e := <-waiting:
		if e.Stage != "b" || e.Holder != "team" {
			t.Errorf("waiting event: %+v", e)
		}
	case r := <-mac:
		t.Fatalf("the mac did not wait for the team, which %s: c's key %.12s (the old c's %.12s), %v", why, reportKey(r.rep, "c"), reportKey(old, "c"), r.err)
	case <-time.After(30 * time.Second):
		t.Fatal("no waiting event")
	}
	return mac
}

// newCEverywhere waits for the team's and the mac's runs to end (after
// what), then checks that the mac took the team's new c, not old's, and
// that no mark is left in the shared store.
func newCEverywhere(t *testing.T, shared string, old *Report, team, mac chan runResult, after string) {
	t.Helper()
	var nt, nm runResult
	for _, ch := range []chan runResult{team, mac} {
		select {
		case r := <-ch:
			if r.err != nil {
				t.Fatal(r.err)
			}
			if ch == team {
				nt = r
			} else {
				nm = r
			}
		case <-time.After(60 * time.Second):
			t.Fatal("a run did not end once " + after)
		}
	}
	if k := reportKey(nm.rep, "c"); k != reportKey(nt.rep, "c") || k == reportKey(old, "c") {
		t.Errorf("the mac's c %.12s, want the team's new c %.12s (the old one %.12s)", k, reportKey(nt.rep, "c"), reportKey(old, "c"))
	}
	// Every mark went with its lease.
	var marks []string
	if err := filepath.WalkDir(filepath.Join(shared, "marks"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			marks = append(marks, p)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(marks) != 0 {
		t.Errorf("marks left after both runs: %v", marks)
	}
}

// A machine without the base files (--only c) takes b from the stage's
// ref; while another machine makes b anew from new base files, it waits
// for that machine (the mark of b's lease names the ref's stage and what
// it makes), then takes the new b: not the b the ref named before. A
// machine making b with other parameters is not waited for.
func TestSharedOnlyWaitsForRefBeingMadeAnew(t *testing.T) {
	shared := t.TempDir()
	file := func(data string, seedB int) string {
		src := filepath.Join(t.TempDir(), "w.bin")
		if data != "" {
			if err := os.WriteFile(src, []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return "name: p\nstore: file://" + shared + "\nstages:\n" +
			"  - name: base\n    import: { path: " + src + " }\n" +
			fmt.Sprintf("  - name: b\n    synth: { size: 1MiB, units: 2, seed: %d, from: base }\n", seedB) +
			"  - name: c\n    synth: { size: 1MiB, units: 2, seed: 3, from: b }\n"
	}
	open := func(src string) *Spec { return machineSpec(t, src) }
	ctx := context.Background()
	old, err := Run(ctx, open(file("the base", 2)), Options{Host: "team"})
	if err != nil {
		t.Fatal(err)
	}
	// The team makes b again, from a new base; b is held at its share,
	// under its lease.
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	BeforeShare(func(stage string) {
		if stage == "b" {
			once.Do(func() { close(held); <-release })
		}
	})
	defer BeforeShare(nil)
	team := make(chan runResult, 1)
	go func() {
		rep, err := Run(ctx, open(file("a new base", 2)), Options{Host: "team"})
		team <- runResult{rep, err}
	}()
	select {
	case <-held:
	case r := <-team:
		t.Fatalf("the team's run ended before b was shared: %v", r.err)
	case <-time.After(30 * time.Second):
		t.Fatal("the team's b was not shared")
	}
	// Another file of the pipeline, whose b has other parameters, is
	// not held up by it: it is refused at once, saying why.
	if _, err := Run(ctx, open(file("", 9)), Options{Host: "mac2", Only: "c"}); err == nil || !strings.Contains(err.Error(), "was made with other parameters") {
		t.Errorf("--only c with a b of other parameters while the team makes its b: %v", err)
	}
	// plan tells what a run does: waits.
	pr, err := Plan(open(file("", 2)), Options{Host: "mac", Only: "c"})
	if err != nil {
		t.Fatal(err)
	}
	for _, sr := range pr.Stages {
		if sr.Stage == "c" && (sr.Action != ActionPending || !strings.Contains(sr.Reason, "stage b is being made on team")) {
			t.Errorf("plan while the team makes b anew: c %s (%s)", sr.Action, sr.Reason)
		}
	}
	mac := macWaitsForB(t, open(file("", 2)), old, "makes b anew")
	close(release)
	newCEverywhere(t, shared, old, team, mac, "the team's b was shared")
}

// The same while the team still imports the new base, before it can key
// b or hold b's lease: its run marks the stages it may make from its
// start (a lease of the run's own), so the Mac waits from then on too,
// and gets the new c. Each mark goes as its stage is decided, and none is
// left when the runs end.
func TestSharedOnlyWaitsWhileTheMakerImports(t *testing.T) {
	shared := t.TempDir()
	src := filepath.Join(t.TempDir(), "w.bin")
	file := func(withBase bool) string {
		path := src
		if !withBase {
			path = filepath.Join(t.TempDir(), "w.bin") // not on the mac
		}
		return "name: p\nstore: file://" + shared + "\nstages:\n" +
			"  - name: base\n    import: { path: " + path + " }\n" +
			"  - name: b\n    synth: { size: 1MiB, units: 2, seed: 2, from: base }\n" +
			"  - name: c\n    synth: { size: 1MiB, units: 2, seed: 3, from: b }\n"
	}
	open := func(src string) *Spec { return machineSpec(t, src) }
	ctx := context.Background()
	if err := os.WriteFile(src, []byte("the base"), 0o644); err != nil {
		t.Fatal(err)
	}
	old, err := Run(ctx, open(file(true)), Options{Host: "team"})
	if err != nil {
		t.Fatal(err)
	}
	// New base files; the team's run is held as its import starts.
	if err := os.WriteFile(src, []byte("a new base"), 0o644); err != nil {
		t.Fatal(err)
	}
	held, release := make(chan struct{}), make(chan struct{})
	var once, released sync.Once
	let := func() { released.Do(func() { close(release) }) }
	t.Cleanup(let) // a test that fails while the team is held lets it go
	StageStarting(func(stage string) {
		if stage == "base" {
			once.Do(func() { close(held); <-release })
		}
	})
	defer StageStarting(nil)
	team := make(chan runResult, 1)
	teamSpec := open(file(true))
	go func() {
		rep, err := Run(ctx, teamSpec, Options{Host: "team"})
		team <- runResult{rep, err}
	}()
	select {
	case <-held:
	case r := <-team:
		t.Fatalf("the team's run ended before its import: %v", r.err)
	case <-time.After(30 * time.Second):
		t.Fatal("the team's import did not start")
	}
	mac := macWaitsForB(t, open(file(false)), old, "imports a new base")
	let()
	newCEverywhere(t, shared, old, team, mac, "the team's import went on")
	// A run that makes nothing takes no lease of its own.
	leases := func() int {
		ents, _ := os.ReadDir(filepath.Join(shared, "leases", "run"))
		return len(ents)
	}
	before := leases()
	if _, err := Run(ctx, teamSpec, Options{Host: "team"}); err != nil {
		t.Fatal(err)
	}
	if n := leases(); n != before {
		t.Errorf("a run with every stage up to date took a lease of its own (%d run leases, %d before)", n, before)
	}
}

// refuseBlobs refuses every blob written to a shared store.
type refuseBlobs struct{ store.Backend }

func (b refuseBlobs) Put(ctx context.Context, key string, body []byte, opt store.PutOptions) (store.Info, error) {
	if strings.HasPrefix(key, "blobs/") {
		return store.Info{}, errors.New("injected: blob writes refused")
	}
	return b.Backend.Put(ctx, key, body, opt)
}

// A stage the run marked as one it may make that turns out up to date
// here, but is not in the shared store (its share failed before), keeps
// its mark until its late share has pointed the ref or marked the stage's
// lease: a machine without the files never sees the ref's old record
// unmarked meanwhile.
func TestSharedPendingMarkKeptUntilShared(t *testing.T) {
	shared := t.TempDir()
	src := filepath.Join(t.TempDir(), "w.bin")
	text := "name: p\nstore: file://" + shared + "\nstages:\n" +
		"  - name: base\n    import: { path: " + src + " }\n" +
		"  - name: b\n    synth: { size: 1MiB, units: 2, seed: 2, from: base }\n"
	cache := filepath.Join(t.TempDir(), "cache")
	open := func() *Spec {
		spec := loadSpec(t, t.TempDir(), text)
		spec.Store = cache
		return spec
	}
	ctx := context.Background()
	if err := os.WriteFile(src, []byte("the base"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(ctx, open(), Options{Host: "team"}); err != nil {
		t.Fatal(err)
	}
	// A new base; b made here, its share refused.
	if err := os.WriteFile(src, []byte("a new base"), 0o644); err != nil {
		t.Fatal(err)
	}
	WrapShared(func(b store.Backend) store.Backend { return refuseBlobs{b} })
	rep, err := Run(ctx, open(), Options{Host: "team"})
	WrapShared(nil)
	var notShared string
	if rep != nil {
		for _, sr := range rep.Stages {
			if sr.Stage == "b" {
				notShared = sr.NotShared
			}
		}
	}
	if err == nil || notShared == "" {
		t.Fatalf("b's share with blob writes refused: %v (not shared: %q)", err, notShared)
	}
	// Touched: the import runs again (b is marked as one the run may
	// make), finds the same bytes, and b is up to date here: held as its
	// late share starts.
	now := time.Now().Add(time.Second)
	if err := os.Chtimes(src, now, now); err != nil {
		t.Fatal(err)
	}
	held, release := make(chan struct{}), make(chan struct{})
	var once, released sync.Once
	let := func() { released.Do(func() { close(release) }) }
	t.Cleanup(let)
	BeforeShare(func(stage string) {
		if stage == "b" {
			once.Do(func() { close(held); <-release })
		}
	})
	defer BeforeShare(nil)
	done := make(chan error, 1)
	go func() {
		_, err := Run(ctx, open(), Options{Host: "team"})
		done <- err
	}()
	select {
	case <-held:
	case err := <-done:
		t.Fatalf("the run ended before b's late share: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("b's late share did not start")
	}
	ms, err := openDirStore(t, shared, "mac").Marked(ctx, manifest.StageRef("p", "b"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].Holder != "team" {
		t.Errorf("marks of b while its late share starts: %+v, want the team's run's", ms)
	}
	let()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ms, err := openDirStore(t, shared, "mac").Marked(ctx, manifest.StageRef("p", "b")); err != nil || len(ms) != 0 {
		t.Errorf("marks of b after the run: %+v, %v", ms, err)
	}
}

// An input outside the selection whose blob is damaged in the shared
// store is not this run's to make again: the run stops (bad data), says
// how to repair, and leaves the blob for verify --repair.
func TestSharedOnlyDamagedInput(t *testing.T) {
	shared, _, open := sharedAB(t)
	ctx := context.Background()
	s := openDirStore(t, shared, "")
	var blob string
	if err := s.Records(ctx, func(key string) error {
		rec, err := s.Record(ctx, key) // a's, the one record
		if err == nil {
			blob = filepath.Join(shared, filepath.FromSlash(store.BlobKey(rec.Outputs[0].Digest)))
		}
		return err
	}); err != nil || blob == "" {
		t.Fatalf("a's blob: %q, %v", blob, err)
	}
	storetest.DamageFile(t, blob)
	_, err := Run(ctx, open(), Options{Host: "mac", Only: "b"})
	if errkind.Of(err) != errkind.VerifyFailed || !strings.Contains(err.Error(), "input a: ") || !strings.Contains(err.Error(), "'ferry store verify --repair "+shared+"' removes the damaged blob") {
		t.Fatalf("--only b with a's blob damaged: %v", err)
	}
	if _, err := os.Stat(blob); err != nil {
		t.Errorf("the damaged blob of an input outside the selection was removed: %v", err)
	}
}

// damagedOnce is storage whose first ranged read of key comes damaged, as
// bytes hurt on their way (the stored ones whole).
type damagedOnce struct {
	store.Backend
	key  string
	once sync.Once
}

func (b *damagedOnce) GetRange(ctx context.Context, key string, off int64, buf []byte) error {
	err := b.Backend.GetRange(ctx, key, off, buf)
	if err == nil && key == b.key && len(buf) > 0 {
		b.once.Do(func() { buf[len(buf)/2] ^= 0xff })
	}
	return err
}

// A blob that hashes wrong once, but whole when read again (hurt on its
// way, not in the store), is not removed: it is fetched again and the
// stage skipped, with a warning.
func TestSharedBlobDamagedOnItsWay(t *testing.T) {
	shared, _, open := sharedAB(t)
	ctx := context.Background()
	s := openDirStore(t, shared, "")
	var d manifest.Digest
	if err := s.Records(ctx, func(key string) error {
		rec, err := s.Record(ctx, key) // a's, the one record
		if err == nil {
			d = rec.Outputs[0].Digest
		}
		return err
	}); err != nil || d == "" {
		t.Fatalf("a's blob: %v", err)
	}
	WrapShared(func(b store.Backend) store.Backend { return &damagedOnce{Backend: b, key: store.BlobKey(d)} })
	defer WrapShared(nil)
	rep, err := Run(ctx, open(), Options{Host: "mac", Only: "a"})
	if err != nil || rep.Stages[0].Action != ActionSkip || rep.Stages[0].Host != "team" {
		t.Fatalf("a with its blob damaged on its way once: %+v, %v", rep, err)
	}
	if w := rep.Stages[0].Warnings; len(w) != 1 || !strings.Contains(w[0], "hashed wrong once, and is not removed: fetching it again") || !strings.Contains(w[0], "it is whole") {
		t.Errorf("warnings: %q", w)
	}
	if _, ok, err := s.HasBlob(ctx, d); !ok || err != nil {
		t.Errorf("the whole blob was removed (%v)", err)
	}
}

// concurrentReads is storage that tells the most blobs it was reading at
// once (each ranged read held a little, so that the reads of blobs
// fetched side by side overlap).
type concurrentReads struct {
	store.Backend
	mu      sync.Mutex
	reading map[string]int
	most    int
}

func (b *concurrentReads) GetRange(ctx context.Context, key string, off int64, buf []byte) error {
	if !strings.HasPrefix(key, "blobs/") {
		return b.Backend.GetRange(ctx, key, off, buf)
	}
	b.mu.Lock()
	b.reading[key]++
	b.most = max(b.most, len(b.reading))
	b.mu.Unlock()
	time.Sleep(100 * time.Millisecond)
	err := b.Backend.GetRange(ctx, key, off, buf)
	b.mu.Lock()
	if b.reading[key]--; b.reading[key] == 0 {
		delete(b.reading, key)
	}
	b.mu.Unlock()
	return err
}

// A stage's outputs that a machine fetches come side by side, at most
// four blobs at once: here the seven shards the merge changed.
func TestSharedFetchSideBySide(t *testing.T) {
	shared := t.TempDir()
	var src strings.Builder
	src.WriteString("name: p\nstore: file://" + shared + "\nstages:\n")
	for _, in := range []string{"base", "adapter-dora"} {
		p, err := filepath.Abs(filepath.Join("..", "testdata", "models", "qwen35-tiny", in))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&src, "  - name: %s\n    import: { path: %s }\n", strings.TrimSuffix(in, "-dora"), p)
	}
	src.WriteString("  - name: merged\n    merge: { base: base, adapter: adapter }\n")
	open := func() *Spec { return machineSpec(t, src.String()) }
	ctx := context.Background()
	if _, err := Run(ctx, open(), Options{Host: "team"}); err != nil {
		t.Fatal(err)
	}
	cr := &concurrentReads{reading: map[string]int{}}
	WrapShared(func(b store.Backend) store.Backend { cr.Backend = b; return cr })
	defer WrapShared(nil)
	rep, err := Run(ctx, open(), Options{Host: "mac"})
	if err != nil {
		t.Fatal(err)
	}
	for _, sr := range rep.Stages {
		if sr.Stage == "merged" && (sr.Action != ActionSkip || sr.Host != "team") {
			t.Fatalf("merged on the mac: %s (%s), want fetched", sr.Action, sr.Reason)
		}
	}
	if cr.most < 2 || cr.most > 4 {
		t.Errorf("at most %d blobs read at once, want 2 to 4 (side by side, within the run's slots)", cr.most)
	}
}

// blobPuts counts the writes of each blob to a shared store, and refuses
// the first one (failed names its blob).
type blobPuts struct {
	store.Backend
	mu     sync.Mutex
	puts   map[string]int
	failed string
}

func (b *blobPuts) Put(ctx context.Context, key string, body []byte, opt store.PutOptions) (store.Info, error) {
	if strings.HasPrefix(key, "blobs/") {
		b.mu.Lock()
		first := b.failed == ""
		if first {
			b.failed = key
		}
		b.mu.Unlock()
		if first {
			return store.Info{}, errors.New("injected: the first blob written is refused")
		}
	}
	in, err := b.Backend.Put(ctx, key, body, opt)
	if err == nil && strings.HasPrefix(key, "blobs/") {
		b.mu.Lock()
		b.puts[key]++
		b.mu.Unlock()
	}
	return in, err
}

func (b *blobPuts) CompleteUpload(ctx context.Context, key, id string, parts []store.Part, opt store.PutOptions) (store.Info, error) {
	in, err := b.Backend.CompleteUpload(ctx, key, id, parts, opt)
	if err == nil {
		b.mu.Lock()
		b.puts[key]++
		b.mu.Unlock()
	}
	return in, err
}

// A merge run that shares its outputs stores each shard as soon as it is
// whole, while it writes the others (its last shard waits here until an
// earlier one is in the shared store: without early sharing none is until
// the merge ends, and the wait fails). The stage's share then stores only
// the rest and the shard whose early upload failed (the first blob
// written is refused here), and the record; another machine fetches the
// stage whole.
func TestSharedOutputsStoredEarly(t *testing.T) {
	// Each shard once whole (TestSharedMergeShardsStoredAhead: before).
	defer MergeNoAhead(MergeNoAhead(true))
	base, open := tinyMergeShared(t, "")
	shards, err := filepath.Glob(filepath.Join(base, "*.safetensors"))
	if err != nil || len(shards) < 3 {
		t.Fatalf("the tiny base has %d shards, want several (%v)", len(shards), err)
	}

	defer EarlyMin(EarlyMin(0)) // the tiny model's shards are small
	var mu sync.Mutex
	early, byShare := map[manifest.Digest]int{}, map[manifest.Digest]int{}
	SharePut(func(d manifest.Digest) {
		mu.Lock()
		byShare[d]++
		mu.Unlock()
	})
	defer SharePut(nil)
	stored := make(chan struct{}, 1)
	EarlyStored(func(d manifest.Digest) {
		mu.Lock()
		early[d]++
		mu.Unlock()
		select {
		case stored <- struct{}{}:
		default:
		}
	})
	defer EarlyStored(nil)
	var done atomic.Int32
	var waited atomic.Bool
	MergeShardDone(func(string) {
		if int(done.Add(1)) != len(shards) {
			return
		}
		select {
		case <-stored:
			waited.Store(true)
		case <-time.After(30 * time.Second):
		}
	})
	defer MergeShardDone(nil)
	bp := &blobPuts{puts: map[string]int{}}
	WrapShared(func(b store.Backend) store.Backend { bp.Backend = b; return bp })
	defer WrapShared(nil)

	bars := &ShareBars{}
	rep, err := Run(context.Background(), open(), Options{Host: "team", ShareProgress: bars.New, Events: bars.Event})
	if err != nil {
		t.Fatal(err)
	}
	if !waited.Load() {
		t.Fatalf("no shard was in the shared store while the merge wrote its last one (%d shards made blobs)", done.Load())
	}
	merged := madeAndShared(t, rep, "merged")
	mu.Lock()
	bp.mu.Lock()
	refused := 0
	for _, o := range merged.Outputs {
		// Each output is stored once: early, or by the share (the
		// refused one, and any the stage handed over at its end that the
		// share came to first); each shard early but the refused one.
		e, sp := early[o.Digest], byShare[o.Digest]
		if e+sp != 1 {
			t.Errorf("%s stored %d times early and %d by the share, want once in all", o.Path, e, sp)
		}
		switch {
		case bp.failed == store.BlobKey(o.Digest):
			refused++
			if sp != 1 {
				t.Errorf("%s, refused early, stored by the share %d times, want once", o.Path, sp)
			}
		case strings.HasSuffix(o.Path, ".safetensors") && e != 1:
			t.Errorf("shard %s stored early %d times, want once", o.Path, e)
		}
	}
	if refused != 1 {
		t.Errorf("the refused blob %q is not one of merged's outputs", bp.failed)
	}
	bp.mu.Unlock()
	mu.Unlock()

	// One upload bar for the stage, from its first early upload (while
	// it ran) to its last output: every byte counted once, the refused
	// blob's too.
	bars.Mu.Lock()
	b := bars.Of["merged"]
	if b == nil || len(bars.Of) != 1 {
		t.Fatalf("upload bars: %v, want one, merged's", bars.Of)
	}
	var want int64
	for _, o := range merged.Outputs {
		want += o.Size
	}
	if b.Opened != 1 || b.Closed != 1 || b.Total != want || b.Done != want {
		t.Errorf("merged's upload bar: opened %d, closed %d times, %d of %d bytes; want once, once, %d of %d", b.Opened, b.Closed, b.Done, b.Total, want, want)
	}
	if b.BeforeDone == 0 {
		t.Errorf("merged's upload bar counted nothing before the stage was done (%d bytes in all)", b.Done)
	}
	bars.Mu.Unlock()

	// Another machine finds the record whole.
	WrapShared(nil)
	rep, err = Run(context.Background(), open(), Options{Host: "mac"})
	if err != nil {
		t.Fatal(err)
	}
	for _, sr := range rep.Stages {
		if sr.Stage == "merged" && (sr.Action != ActionSkip || sr.Host != "team") {
			t.Fatalf("merged on the mac: %s (%s), want fetched", sr.Action, sr.Reason)
		}
	}
}

// tinyMergeShared is a pipeline of the tiny DoRA merge, then the stages
// of more (YAML), on a file:// shared store: the base's directory, and a
// spec of a cache of its own each time open is called (a machine).
func tinyMergeShared(t *testing.T, more string) (string, func() *Spec) {
	t.Helper()
	shared := t.TempDir()
	base, err := filepath.Abs(filepath.Join("..", "testdata", "models", "qwen35-tiny", "base"))
	if err != nil {
		t.Fatal(err)
	}
	adapter := filepath.Join(filepath.Dir(base), "adapter-dora")
	src := "name: p\nstore: file://" + shared + "\nstages:\n" +
		"  - name: base\n    import: { path: " + base + " }\n" +
		"  - name: adapter\n    import: { path: " + adapter + " }\n" +
		"  - name: merged\n    merge: { base: base, adapter: adapter }\n" + more
	return base, func() *Spec { return machineSpec(t, src) }
}

// The MLX stage hands each shard over as soon as it is whole, while it
// converts: in a run that shares it, its shards are stored early, once,
// and the share stores only the small files; another machine fetches the
// stage.
func TestSharedMLXShardsStoredEarly(t *testing.T) {
	_, open := tinyMergeShared(t, "  - name: mlx4\n    mlx_quantize: { from: merged, bits: 4, group_size: 64 }\n")
	defer EarlyMin(EarlyMin(0))
	sc := countStores(t)
	mu := &sc.mu
	handed := map[string]int{}
	MLXShardDone(func(name string) {
		mu.Lock()
		handed[name]++
		mu.Unlock()
	})
	defer MLXShardDone(nil)
	rep, err := Run(context.Background(), open(), Options{Host: "team"})
	if err != nil {
		t.Fatal(err)
	}
	mlx := madeAndShared(t, rep, "mlx4")
	shards := sc.onceEarly(t, mlx.Outputs)
	mu.Lock()
	for _, o := range shards {
		if handed[o.Path] != 1 {
			t.Errorf("shard %s handed over %d times while the stage converted, want once", o.Path, handed[o.Path])
		}
	}
	mu.Unlock()
	if len(shards) == 0 {
		t.Fatalf("mlx4 made no shard: %v", mlx.Outputs)
	}

	rep, err = Run(context.Background(), open(), Options{Host: "mac"})
	if err != nil {
		t.Fatal(err)
	}
	for _, sr := range rep.Stages {
		if sr.Stage == "mlx4" && (sr.Action != ActionSkip || sr.Host != "team") {
			t.Fatalf("mlx4 on the mac: %s (%s), want fetched", sr.Action, sr.Reason)
		}
	}
}

// A shared merge stores each shard while it writes it: the digest worked
// out ahead of the bytes, the upload reads the shard's partial file as it
// grows (a shard whole waits, before it is handed over, for its upload
// to have started). Each shard is stored once, early, and its bytes are
// on the stage's upload bar once; another machine fetches the stage.
// With the first blob write refused (a stream that fails), the whole
// shard, handed over after that, goes up early in its place.
func TestSharedMergeShardsStoredAhead(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		t.Run(map[bool]string{false: "all streams stored", true: "first write refused"}[refuse], func(t *testing.T) {
			_, open := tinyMergeShared(t, "")
			defer EarlyMin(EarlyMin(0))
			sc := countStores(t)
			mu := &sc.mu
			started := map[string]chan struct{}{}
			ch := func(name string) chan struct{} {
				mu.Lock()
				defer mu.Unlock()
				if started[name] == nil {
					started[name] = make(chan struct{})
				}
				return started[name]
			}
			failed := make(chan struct{})
			var failedOnce sync.Once
			EarlyFailed(func(manifest.Digest) { failedOnce.Do(func() { close(failed) }) })
			defer EarlyFailed(nil)
			var late atomic.Int32
			MergeAhead(func(name string) { close(ch(name)) }, func(name string) {
				select {
				case <-ch(name):
				case <-time.After(10 * time.Second):
					late.Add(1)
				}
				if refuse {
					// The refused stream is over before any shard is
					// handed over whole.
					select {
					case <-failed:
					case <-time.After(10 * time.Second):
						late.Add(1)
					}
				}
			})
			defer MergeAhead(nil, nil)
			bp := &blobPuts{puts: map[string]int{}}
			if refuse {
				WrapShared(func(b store.Backend) store.Backend { bp.Backend = b; return bp })
				defer WrapShared(nil)
			}
			bars := &ShareBars{}
			rep, err := Run(context.Background(), open(), Options{Host: "team", ShareProgress: bars.New})
			if err != nil {
				t.Fatal(err)
			}
			merged := madeAndShared(t, rep, "merged")
			if late.Load() != 0 {
				t.Errorf("%d waits for a shard's upload to start (or fail) timed out", late.Load())
			}
			shards := len(sc.onceEarly(t, merged.Outputs))
			mu.Lock()
			if shards < 3 || len(started) != shards {
				t.Errorf("%d of %d shards stored ahead", len(started), shards)
			}
			mu.Unlock()
			if refuse && bp.failed == "" {
				t.Error("no blob write was refused")
			}
			var want int64
			for _, o := range merged.Outputs {
				want += o.Size
			}
			bars.Mu.Lock()
			if b := bars.Of["merged"]; b == nil || b.Done != want || b.Total != want {
				t.Errorf("merged's upload bar: %+v, want %d of %d bytes", b, want, want)
			}
			bars.Mu.Unlock()

			// Another machine fetches it (each blob verified as it comes).
			WrapShared(nil)
			rep, err = Run(context.Background(), open(), Options{Host: "mac"})
			if err != nil {
				t.Fatal(err)
			}
			if sr := stageOf(rep, "merged"); sr.Action != ActionSkip || sr.Host != "team" || sr.Key != merged.Key {
				t.Fatalf("merged on the mac: %s (%s), want fetched", sr.Action, sr.Reason)
			}
		})
	}
}

// storeCounts counts, by blob, the outputs stored early and those the
// share stored itself (the hooks set for the test).
type storeCounts struct {
	mu             sync.Mutex
	early, byShare map[manifest.Digest]int
}

func countStores(t *testing.T) *storeCounts {
	sc := &storeCounts{early: map[manifest.Digest]int{}, byShare: map[manifest.Digest]int{}}
	SharePut(func(d manifest.Digest) {
		sc.mu.Lock()
		sc.byShare[d]++
		sc.mu.Unlock()
	})
	EarlyStored(func(d manifest.Digest) {
		sc.mu.Lock()
		sc.early[d]++
		sc.mu.Unlock()
	})
	t.Cleanup(func() { SharePut(nil); EarlyStored(nil) })
	return sc
}

// onceEarly checks that each shard of outs was stored once, early, and
// returns the shards.
func (sc *storeCounts) onceEarly(t *testing.T, outs []manifest.Output) []manifest.Output {
	t.Helper()
	sc.mu.Lock()
	defer sc.mu.Unlock()
	var shards []manifest.Output
	for _, o := range outs {
		if !strings.HasSuffix(o.Path, ".safetensors") {
			continue
		}
		shards = append(shards, o)
		if e, sp := sc.early[o.Digest], sc.byShare[o.Digest]; e != 1 || sp != 0 {
			t.Errorf("shard %s stored %d times early and %d by the share, want once early", o.Path, e, sp)
		}
	}
	return shards
}

// machineSpec is the pipeline src with a cache of its own: a machine of
// a shared store.
func machineSpec(t *testing.T, src string) *Spec {
	t.Helper()
	spec := loadSpec(t, t.TempDir(), src)
	spec.Store = filepath.Join(t.TempDir(), "cache")
	return spec
}
