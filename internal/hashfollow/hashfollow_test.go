package hashfollow

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

// files is the concatenation of in-memory files that the follower reads:
// it fails the test when a read reaches a byte no write has put there yet.
type files struct {
	t       *testing.T
	mu      sync.Mutex
	data    []byte
	written []bool
}

func (f *files) write(off int64, b []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	copy(f.data[off:], b)
	for i := range b {
		f.written[off+int64(i)] = true
	}
}

func (f *files) ReadAt(b []byte, off int64) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range b {
		if !f.written[off+int64(i)] {
			f.t.Errorf("read of byte %d before it was written", off+int64(i))
			break
		}
	}
	return copy(b, f.data[off:]), nil
}

// TestFollower: units write their regions in an order of their own, the
// workers in any order, and the follower never reads a byte before it is
// written; its digests are each file's SHA-256. Regions of one unit lie
// apart (as an MLX tensor's weight, scales and biases), some are empty,
// and a file may be empty.
func TestFollower(t *testing.T) {
	cases := []struct {
		name    string
		files   []int64 // sizes
		header  int64   // bytes of file 0 written before the units
		units   int
		perUnit int // regions a unit writes, spread over the files
		workers int
		empty   bool // every third region has no bytes
	}{
		{"one file, one region a unit", []int64{1 << 16}, 100, 64, 1, 4, false},
		{"three regions a unit", []int64{3 << 16}, 64, 40, 3, 8, false},
		{"several files", []int64{1 << 15, 0, 1 << 14, 777}, 10, 30, 3, 3, false},
		{"empty regions", []int64{1 << 15}, 0, 50, 2, 5, true},
		{"one worker", []int64{5000, 5000}, 8, 20, 2, 1, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(len(tc.name))))
			var total int64
			ends := make([]int64, len(tc.files))
			for i, n := range tc.files {
				total += n
				ends[i] = total
			}
			// Cut the bytes after the header into units×perUnit regions,
			// laid out as an MLX shard's: units in blocks of four (a
			// tensor's row blocks), each block's regions by output
			// (weight, scales, biases), so that a unit's regions lie
			// apart and other units' lie between them.
			n := tc.units * tc.perUnit
			cuts := []int64{tc.header}
			for i := 1; i < n; i++ {
				cuts = append(cuts, tc.header+(total-tc.header)*int64(i)/int64(n))
			}
			cuts = append(cuts, total)
			var regions []Region
			type span struct{ off, end int64 }
			spans := make([][]span, tc.units)
			i := 0
			for b := 0; b < tc.units; b += 4 {
				for range tc.perUnit {
					for k := b; k < min(b+4, tc.units); k++ {
						s, e := cuts[i], cuts[i+1]
						if tc.empty && i%3 == 0 && i+1 < n {
							cuts[i+1] = s // the next region takes this one's bytes
							e = s
						}
						regions = append(regions, Region{Start: s, Unit: k})
						spans[k] = append(spans[k], span{s, e})
						i++
					}
				}
			}
			fs := &files{t: t, data: make([]byte, total), written: make([]bool, total)}
			hdr := make([]byte, tc.header)
			for i := range hdr {
				hdr[i] = byte(rng.Uint32())
			}
			fs.write(0, hdr)
			names := func(i int) string { return fmt.Sprintf("file%d", i) }
			f, err := New(fs, ends, regions, tc.units, names)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			done := make(chan error, 1)
			go func() { done <- f.Run(ctx) }()
			order := rng.Perm(tc.units)
			next := make(chan int)
			var wg sync.WaitGroup
			for w := range tc.workers {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(w), 7))
					for k := range next {
						for _, j := range r.Perm(len(spans[k])) {
							s := spans[k][j]
							b := make([]byte, s.end-s.off)
							for i := range b {
								b[i] = byte(r.Uint32())
							}
							fs.write(s.off, b)
							time.Sleep(time.Duration(r.IntN(50)) * time.Microsecond)
						}
						f.Written(k)
						// Time for the follower to catch up, so that it
						// waits at units not yet written.
						time.Sleep(time.Duration(r.IntN(400)) * time.Microsecond)
					}
				})
			}
			for _, k := range order {
				next <- k
			}
			close(next)
			wg.Wait()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			sums := f.Sums()
			var start int64
			for i, end := range ends {
				want := sha256.Sum256(fs.data[start:end])
				if string(sums[i]) != string(want[:]) {
					t.Errorf("%s: digest %x, want %x", names(i), sums[i], want)
				}
				start = end
			}
		})
	}
}

// TestFollowerWaits: the follower hashes nothing past a region whose
// unit is not written, and stops when its context ends.
func TestFollowerWaits(t *testing.T) {
	fs := &files{t: t, data: make([]byte, 300), written: make([]bool, 300)}
	f, err := New(fs, []int64{300}, []Region{{0, 0}, {100, 1}, {200, 2}}, 3, func(int) string { return "f" })
	if err != nil {
		t.Fatal(err)
	}
	fs.write(0, make([]byte, 100))
	fs.write(200, make([]byte, 100))
	f.Written(0)
	f.Written(2) // unit 1 (bytes 100..200) is not written
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := f.Run(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run with a unit never written: %v, want the context's end", err)
	}
}

func TestNewErrors(t *testing.T) {
	names := func(i int) string { return fmt.Sprintf("file%d", i) }
	cases := []struct {
		name    string
		ends    []int64
		regions []Region
		units   int
		want    string
	}{
		{"no files", nil, nil, 0, "no files"},
		{"files out of order", []int64{10, 5}, nil, 0, "file1: internal plan error: file 1 ends at 5"},
		{"regions out of order", []int64{10}, []Region{{5, 0}, {4, 1}}, 2, "region 1 (unit 1) starts at 4"},
		{"unknown unit", []int64{10}, []Region{{0, 2}}, 2, "names unit 2 of 2"},
		{"negative unit", []int64{10}, []Region{{0, -1}}, 2, "names unit -1 of 2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(nil, tc.ends, tc.regions, tc.units, names)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestNilWritten(t *testing.T) {
	var f *Follower
	f.Written(3) // a nil follower ignores it
}

// TestFollowerUnitOrder: units written in an order other than their
// regions' file order: the follower goes as far as the first region of a
// unit not yet written, whatever the units' numbers, and waits there.
func TestFollowerUnitOrder(t *testing.T) {
	cases := []struct {
		name    string
		regions []Region // over 40 bytes
		order   []int    // units in the order they are written
	}{
		{"unit 1 first in the file", []Region{{0, 1}, {10, 0}, {20, 1}, {30, 0}}, []int{0, 1}},
		{"last unit first", []Region{{0, 2}, {10, 1}, {20, 0}, {30, 2}}, []int{0, 1, 2}},
		{"an empty region ahead", []Region{{0, 0}, {10, 1}, {10, 2}, {30, 0}}, []int{2, 0, 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := &files{t: t, data: make([]byte, 40), written: make([]bool, 40)}
			f, err := New(fs, []int64{40}, tc.regions, len(tc.order), func(int) string { return "f" })
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- f.Run(context.Background()) }()
			for _, k := range tc.order {
				for i, rg := range tc.regions {
					if rg.Unit != k {
						continue
					}
					end := int64(40)
					if i+1 < len(tc.regions) {
						end = tc.regions[i+1].Start
					}
					b := make([]byte, end-rg.Start)
					for j := range b {
						b[j] = byte(k + 1)
					}
					fs.write(rg.Start, b)
				}
				f.Written(k)
				time.Sleep(20 * time.Millisecond) // the follower goes as far as it may
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if want := sha256.Sum256(fs.data); string(f.Sums()[0]) != string(want[:]) {
				t.Errorf("digest %x, want %x", f.Sums()[0], want)
			}
		})
	}
}
