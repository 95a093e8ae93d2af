package gguf

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/internal/cpushare"
)

// UnitWork.Cores: every unit is made holding a slot of the gate, so
// while work of a higher priority holds the slots no unit is made, the
// units made at once never outnumber the slots, and the file is the same
// as without a gate.
func TestWriteUnitsCores(t *testing.T) {
	l, err := PlanLayout([]KV{{Key: "general.architecture", Type: ValueString, Value: "llama"}},
		[]TensorSpec{{Name: "a", Dims: []uint64{64, 40}, Type: quant.F32}, {Name: "b", Dims: []uint64{32, 8}, Type: quant.F32}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var units []Unit
	for i, ti := range l.Tensors {
		units = SplitRows(units, i, int64(ti.Dims[1]), 2)
	}
	dir := t.TempDir()
	var files atomic.Int32
	var onMake func(k int) // called in Make, when set
	write := func(cores *cpushare.Share, inFlight *atomic.Int32, peak *atomic.Int32, made *atomic.Int32) ([]byte, error) {
		path := filepath.Join(dir, fmt.Sprintf("m%d.gguf", files.Add(1)))
		w, err := Create(path, l, Options{NoSync: true})
		if err != nil {
			return nil, err
		}
		err = w.WriteUnits(context.Background(), units, UnitWork{Jobs: 4, Cores: cores,
			Make: func(_, k int) ([]byte, int64, error) {
				n := inFlight.Add(1)
				defer inFlight.Add(-1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				made.Add(1)
				time.Sleep(200 * time.Microsecond)
				if onMake != nil {
					onMake(k)
				}
				u := units[k]
				row := int64(l.Tensors[u.T].Dims[0]) * 4
				return bytes.Repeat([]byte{byte(k + 1)}, int((u.R1-u.R0)*row)), u.R0 * row, nil
			}})
		if err != nil {
			return nil, err
		}
		if err := w.Close(); err != nil {
			return nil, err
		}
		return os.ReadFile(path)
	}
	var a, b, c atomic.Int32
	want, err := write(nil, &a, &b, &c)
	if err != nil {
		t.Fatal(err)
	}
	if b.Load() < 2 {
		t.Fatalf("without a gate at most %d unit made at once: the test needs several", b.Load())
	}

	g := cpushare.New(2)
	ctx := context.Background()
	// Work of a higher priority holds both slots.
	for range 2 {
		if err := g.Acquire(ctx, 10); err != nil {
			t.Fatal(err)
		}
	}
	var inFlight, peak, made atomic.Int32
	done := make(chan error)
	var got []byte
	go func() {
		var err error
		got, err = write(g.Share(1), &inFlight, &peak, &made)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if n := made.Load(); n != 0 {
		t.Fatalf("%d units made while the gate's slots were held", n)
	}
	g.Release()
	g.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if int(made.Load()) != len(units) {
		t.Errorf("%d units made, want %d", made.Load(), len(units))
	}
	if p := peak.Load(); p > 2 {
		t.Errorf("%d units made at once through a gate of 2 slots", p)
	}
	if !bytes.Equal(got, want) {
		t.Error("the file written through the gate differs")
	}

	// Work of a higher priority that comes while the units are made gets
	// a slot between two units, and none is made while it holds it.
	// Unit 3 is made once the higher work waits: the slot is offered to
	// it before unit 4.
	g = cpushare.New(1)
	inFlight, peak, made = atomic.Int32{}, atomic.Int32{}, atomic.Int32{}
	queued := make(chan struct{})
	onMake = func(k int) {
		if k == 3 {
			<-queued
		}
	}
	go func() {
		var err error
		got, err = write(g.Share(1), &inFlight, &peak, &made)
		done <- err
	}()
	for made.Load() < 4 { // unit 3 begun: the writer holds the slot
		time.Sleep(time.Millisecond)
	}
	acquired := make(chan error)
	go func() { acquired <- g.Acquire(ctx, 10) }()
	for g.Waiting() < 4 { // the writer's 3 other workers and this
		time.Sleep(time.Millisecond)
	}
	close(queued)
	if err := <-acquired; err != nil {
		t.Fatal(err)
	}
	at := made.Load()
	time.Sleep(30 * time.Millisecond)
	if n := made.Load(); n != at || n != 4 {
		t.Errorf("units made while the higher work held the slot: %d, then %d of %d", at, n, len(units))
	}
	g.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("the file written through the gate, interrupted, differs")
	}
}

// A worker waiting for its file while another worker's write holds it
// (a write that waits long on the disk) gives its slot back: work of a
// lower priority makes its units meanwhile instead of the cores standing
// idle, and both files come out whole.
func TestWriteUnitsCoresWriteWait(t *testing.T) {
	l, err := PlanLayout([]KV{{Key: "general.architecture", Type: ValueString, Value: "llama"}},
		[]TensorSpec{{Name: "a", Dims: []uint64{64, 40}, Type: quant.F32}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	units := SplitRows(nil, 0, 40, 2)
	row := int64(64 * 4)
	uw := func(cores *cpushare.Share, made *atomic.Int32) UnitWork {
		return UnitWork{Jobs: 2, Cores: cores, Make: func(_, k int) ([]byte, int64, error) {
			made.Add(1)
			u := units[k]
			return bytes.Repeat([]byte{byte(k + 1)}, int((u.R1-u.R0)*row)), u.R0 * row, nil
		}}
	}
	dir := t.TempDir()
	create := func(name string) *Writer {
		w, err := Create(filepath.Join(dir, name), l, Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	var refMade atomic.Int32
	ref := create("ref.gguf")
	if err := ref.WriteUnits(context.Background(), units, uw(nil, &refMade)); err != nil {
		t.Fatal(err)
	}
	if err := ref.Close(); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(dir, "ref.gguf"))
	if err != nil {
		t.Fatal(err)
	}

	g := cpushare.New(2)
	ctx := context.Background()
	hi, lo := create("hi.gguf"), create("lo.gguf")
	hi.wmu.Lock() // a write of hi's that waits on the disk
	var hiMade, loMade atomic.Int32
	hiDone, loDone := make(chan error, 1), make(chan error, 1)
	go func() { hiDone <- hi.WriteUnits(ctx, units, uw(g.Share(10), &hiMade)) }()
	for hiMade.Load() < 2 { // both of hi's workers took a slot and made a unit
		time.Sleep(time.Millisecond)
	}
	go func() { loDone <- lo.WriteUnits(ctx, units, uw(g.Share(1), &loMade)) }()
	select {
	case err := <-loDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the lower work made %d of %d units while the higher work's workers waited for their file", loMade.Load(), len(units))
	}
	if n := hiMade.Load(); n != 2 {
		t.Errorf("%d units of the higher work made while its file was held, want 2", n)
	}
	hi.wmu.Unlock()
	if err := <-hiDone; err != nil {
		t.Fatal(err)
	}
	for name, w := range map[string]*Writer{"hi.gguf": hi, "lo.gguf": lo} {
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(filepath.Join(dir, name)); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s differs from the file written without a gate (%v)", name, err)
		}
	}
	if g.Waiting() != 0 {
		t.Errorf("%d waiting on the gate after both ended", g.Waiting())
	}
	// Every slot is free again: both can be taken at once.
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for range 2 {
		if err := g.Acquire(tctx, 1); err != nil {
			t.Fatalf("a slot of the gate is not free after both ended: %v", err)
		}
	}
}
