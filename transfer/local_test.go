package transfer

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// Small files to a local directory are read back as they are written and
// renamed at once; one whose first write lands wrong is found by that
// read, checked again by the batched check, sent again and renamed only
// once right, and the others are not held back by it.
func TestLocalSmallReadBackRepairs(t *testing.T) {
	src := filepath.Join(t.TempDir(), "m")
	want := map[string][]byte{}
	for _, n := range []string{"a.bin", "b.bin", "c.bin"} {
		want[n] = randomFile(t, filepath.Join(src, n), 3000+int64(len(want)), uint64(len(want)+40))
	}
	var mu sync.Mutex
	flipped := 0
	localWriteHook = func(rel string, off int64, data []byte) []byte {
		mu.Lock()
		defer mu.Unlock()
		if rel == "m/b.bin" && flipped == 0 {
			flipped++
			return flipOne(rel, off, data)
		}
		return data
	}
	t.Cleanup(func() { localWriteHook = nil })
	for _, later := range []bool{false, true} {
		flipped = 0
		dst := t.TempDir()
		p, err := NewPlan(context.Background(), []string{src}, PlanOptions{HashLater: later})
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Run(context.Background(), p, []Destination{{Name: dst, Dir: dst, Local: true}}, Options{StateDir: t.TempDir(), Log: testLog(t)})
		if err != nil {
			t.Fatalf("hashLater %v: %v", later, err)
		}
		for n, b := range want {
			if got, err := os.ReadFile(filepath.Join(dst, "m", n)); err != nil || !bytes.Equal(got, b) {
				t.Errorf("hashLater %v: %s differs at the destination (%v)", later, n, err)
			}
		}
		for _, fr := range rep.Hosts[0].Files {
			if wantRep := map[bool]int{true: 1, false: 0}[fr.Path == "m/b.bin"]; fr.Repaired != wantRep || !fr.Verified {
				t.Errorf("hashLater %v: %s: repaired %d, verified %v; want %d, true", later, fr.Path, fr.Repaired, fr.Verified, wantRep)
			}
		}
		if ps := partials(t, dst); len(ps) > 0 {
			t.Errorf("hashLater %v: partials left: %v", later, ps)
		}
	}
}
