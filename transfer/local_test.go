package transfer

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
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

// A HashLater plan to two directories, one fresh and one holding two of
// the files with their sizes (one right, one other bytes): only those two
// are hashed before sending; the right one is kept there, the other
// replaced, the fresh directory gets all, and the report gives every
// file's digest.
func TestHashLaterHashesOnlyWhatIsThere(t *testing.T) {
	src := filepath.Join(t.TempDir(), "m")
	for i, n := range []string{"a.bin", "b.bin", "c.bin", "d.bin"} {
		randomFile(t, filepath.Join(src, n), int64(5000+i*700), uint64(50+i))
	}
	randomFile(t, filepath.Join(src, "big.bin"), 3<<20+9, 60)
	fresh, held := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(held, "m"), 0o755); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(filepath.Join(src, "a.bin"))
	os.WriteFile(filepath.Join(held, "m", "a.bin"), a, 0o644)
	other := append([]byte(nil), a...)
	other[0] ^= 1
	os.WriteFile(filepath.Join(held, "m", "big.bin"), append(other, make([]byte, 3<<20+9-len(other))...), 0o644)
	var hashed atomic.Int64
	p, err := NewPlan(context.Background(), []string{src}, PlanOptions{ChunkSize: 1 << 20, HashLater: true, Hashed: func(n int64) { hashed.Add(n) }})
	if err != nil {
		t.Fatal(err)
	}
	dests := []Destination{{Name: fresh, Dir: fresh, Local: true}, {Name: held, Dir: held, Local: true}}
	rep, err := Run(context.Background(), p, dests, Options{StateDir: t.TempDir(), Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(len(a)) + 3<<20 + 9; hashed.Load() != want {
		t.Errorf("%d bytes hashed before sending, want a.bin's and big.bin's %d", hashed.Load(), want)
	}
	for k, h := range rep.Hosts {
		sameTree(t, src, filepath.Join(dests[k].Dir, "m"))
		for _, fr := range h.Files {
			if want := fileDigest(t, filepath.Join(filepath.Dir(src), filepath.FromSlash(fr.Path))); fr.Digest != want || !fr.Verified {
				t.Errorf("%s: %s: digest %s, verified %v; want %s", h.Destination, fr.Path, fr.Digest, fr.Verified, want)
			}
			if skipped := k == 1 && fr.Path == "m/a.bin"; fr.Skipped != skipped {
				t.Errorf("%s: %s: skipped %v, want %v", h.Destination, fr.Path, fr.Skipped, skipped)
			}
		}
	}
}
