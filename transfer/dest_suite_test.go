package transfer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/killtest"
	"github.com/ferry-llm/ferry/internal/sshdtest"
)

// destKind is one kind of destination the suite runs on.
type destKind struct {
	name string
	dest func(t *testing.T, dir string) Destination
	// child is the destination as a transfer child process reaches it.
	child func(t *testing.T, dir string) childDest
	// liar is a destination at dir whose verification meets wrong bytes
	// (a lying hash tool, a disk that corrupts what it is given).
	liar func(t *testing.T, dir string) Destination
	// verifier is what the report says verified the files.
	verifier string
}

// destKinds are the destination kinds: every test of the suite runs on
// each.
func destKinds() []destKind {
	var once, lonce sync.Once
	var srv, liar *sshdtest.Server
	sshd := func(t *testing.T) *sshdtest.Server {
		once.Do(func() { srv = startSSHD(t) })
		return srv
	}
	return []destKind{
		{
			name: "sftp",
			dest: func(t *testing.T, dir string) Destination {
				s := sshd(t)
				return Destination{Name: "h:" + dir, Host: "h", Dir: dir, Dial: testDialer(s, s.Addr())}
			},
			child: func(t *testing.T, dir string) childDest { return childDestOf(sshd(t), dir) },
			liar: func(t *testing.T, dir string) Destination {
				lonce.Do(func() { liar = startSSHD(t, "PATH="+liarTools(t)+":/usr/bin:/bin") })
				return Destination{Name: "liar:" + dir, Host: "liar", Dir: dir, Dial: testDialer(liar, liar.Addr())}
			},
			verifier: "dd | ",
		},
		{
			name:  "local",
			dest:  func(t *testing.T, dir string) Destination { return Destination{Name: dir, Dir: dir, Local: true} },
			child: func(t *testing.T, dir string) childDest { return childDest{Name: dir, Dir: dir, Local: true} },
			liar: func(t *testing.T, dir string) Destination {
				// Every write of the file lands with one byte flipped.
				localWriteHook = func(rel string, off int64, data []byte) []byte {
					b := append([]byte(nil), data...)
					if len(b) > 0 {
						b[len(b)/2] ^= 0x40
					}
					return b
				}
				t.Cleanup(func() { localWriteHook = nil })
				return Destination{Name: dir, Dir: dir, Local: true}
			},
			verifier: localVerifier,
		},
	}
}

// suite runs f on every destination kind.
func suite(t *testing.T, f func(t *testing.T, k destKind)) {
	for _, k := range destKinds() {
		t.Run(k.name, func(t *testing.T) { f(t, k) })
	}
}

// A fresh copy of a tree (a file of many chunks, a small one, an empty
// one, a link), then a rerun that sends nothing, and one with Verify that
// re-hashes and sends nothing either.
func TestDestFreshAndNoop(t *testing.T) {
	suite(t, func(t *testing.T, k destKind) {
		src := filepath.Join(t.TempDir(), "model")
		randomFile(t, filepath.Join(src, "a.bin"), 5<<20+123, 1)
		randomFile(t, filepath.Join(src, "sub", "b.bin"), 70000, 2)
		randomFile(t, filepath.Join(src, "empty"), 0, 3)
		if err := os.Symlink("sub/b.bin", filepath.Join(src, "link.bin")); err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(t.TempDir(), "not", "yet")
		ctx := context.Background()
		p, err := NewPlan(ctx, []string{src}, PlanOptions{ChunkSize: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		d := k.dest(t, dst)
		state := t.TempDir()
		rep, err := Run(ctx, p, []Destination{d}, Options{StateDir: state, Log: testLog(t)})
		if err != nil {
			t.Fatal(err)
		}
		sameTree(t, src, filepath.Join(dst, "model"))
		if got := partials(t, dst); len(got) > 0 {
			t.Errorf("partials left: %v", got)
		}
		h := rep.Hosts[0]
		if !h.OK || h.Sent != p.Bytes() || len(h.Files) != 3 || !strings.HasPrefix(h.HashCommand, k.verifier) {
			t.Errorf("report: %+v", h)
		}
		fi, err := os.Stat(filepath.Join(dst, "model", "a.bin"))
		if err != nil || fi.Mode().Perm() != 0o644 {
			t.Errorf("a.bin: %v, %v; want mode 0644", fi, err)
		}
		for _, verify := range []bool{false, true} {
			rep, err = Run(ctx, p, []Destination{d}, Options{StateDir: state, Log: testLog(t), Verify: verify})
			if err != nil {
				t.Fatal(err)
			}
			if h := rep.Hosts[0]; h.Sent != 0 || !h.OK {
				t.Errorf("rerun (verify %v) sent %d bytes: %+v", verify, h.Sent, h)
			}
		}
	})
}

// The sending process killed with SIGKILL at random moments and run again
// each time: the tree ends identical, nothing left behind.
func TestDestKilled(t *testing.T) {
	suite(t, func(t *testing.T, k destKind) {
		src := filepath.Join(t.TempDir(), "tree")
		smallTree(t, src, 200, 50, 7)
		randomFile(t, filepath.Join(src, "big.bin"), 20<<20+17, 9) // 2 chunks of the default 16 MiB
		state := t.TempDir()
		dst := t.TempDir()
		spec, _ := json.Marshal(childSpec{Src: src, State: state, Dests: []childDest{k.child(t, dst)}})
		start := func() *exec.Cmd {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "FERRY_TRANSFER_CHILD="+string(spec))
			return cmd
		}
		full, _ := json.Marshal(childSpec{Src: src, State: t.TempDir(), Dests: []childDest{k.child(t, t.TempDir())}})
		t0 := time.Now()
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "FERRY_TRANSFER_CHILD="+string(full))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("uninterrupted run: %v: %s", err, out)
		}
		took := time.Since(t0)
		landed := func() int {
			n := 0
			filepath.WalkDir(dst, func(p string, de fs.DirEntry, err error) error {
				if err == nil && de.Type().IsRegular() && !strings.HasSuffix(p, ".partial") {
					n++
				}
				return nil
			})
			return n
		}
		killtest.AtRandom(t, 4, took, rand.New(rand.NewPCG(30, uint64(len(k.name)))), start, func(kill int) bool {
			done := landed() == 201 && len(partials(t, dst)) == 0
			t.Logf("kill %d: %d of 201 files in place", kill, landed())
			if done {
				ents, _ := os.ReadDir(dst)
				for _, e := range ents {
					os.RemoveAll(filepath.Join(dst, e.Name()))
				}
			}
			return done
		}, func() bool { return landed() > 0 || len(partials(t, dst)) > 0 })
		if out, err := start().CombinedOutput(); err != nil {
			t.Fatalf("the run after the kills: %v: %s", err, out)
		}
		sameTree(t, src, filepath.Join(dst, "tree"))
		if got := partials(t, dst); len(got) > 0 {
			t.Errorf("partials left: %v", got)
		}
		if j, _ := filepath.Glob(filepath.Join(state, "*.journal")); len(j) > 0 {
			t.Errorf("journals left after a complete run: %v", j)
		}
	})
}

// A chunk of a partial altered between an interrupted run and its resume
// is found and sent again, alone.
func TestDestRepairAlteredChunk(t *testing.T) {
	suite(t, func(t *testing.T, k destKind) {
		src := filepath.Join(t.TempDir(), "w.bin")
		want := randomFile(t, src, 3<<20, 12)
		dst := t.TempDir()
		state := t.TempDir()
		const cs = 256 << 10
		p, err := NewPlan(context.Background(), []string{src}, PlanOptions{ChunkSize: cs})
		if err != nil {
			t.Fatal(err)
		}
		d := k.dest(t, dst)
		ctx, cancel := context.WithCancel(context.Background())
		var seen atomic.Int64
		_, err = Run(ctx, p, []Destination{d}, Options{StateDir: state, Log: testLog(t), Streams: 1,
			Progress: func(string, int64) progressReporter {
				return &cancelAt{n: &seen, at: int64(len(want)) / 2, cancel: cancel}
			}})
		if err == nil {
			t.Fatal("cancelled run succeeded")
		}
		jl, err := os.ReadFile(JournalPath(state, d.Name))
		if err != nil {
			t.Fatal(err)
		}
		chunk := -1
		for _, line := range strings.Split(string(jl), "\n") {
			if _, idx, ok := strings.Cut(line, `"unit":"c:w.bin#`); ok {
				if _, err := fmtSscan(idx, &chunk); err == nil {
					break
				}
			}
		}
		if chunk < 0 {
			t.Fatalf("the cancelled run journaled no chunk:\n%s", jl)
		}
		at := int64(chunk)*cs + 1000
		f, err := os.OpenFile(filepath.Join(dst, "w.bin.partial"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteAt([]byte{want[at] ^ 0xff}, at)
		f.Close()
		rep, err := Run(context.Background(), p, []Destination{d}, Options{StateDir: state, Log: testLog(t)})
		if err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(filepath.Join(dst, "w.bin"))
		if !bytes.Equal(got, want) {
			t.Fatal("the file differs after the repair")
		}
		if fr := rep.Hosts[0].Files[0]; !fr.Resumed || fr.Repaired != 1 || fr.Sent >= int64(len(want)) {
			t.Errorf("want a resumed file with 1 repaired chunk and less than the whole sent; got %+v", fr)
		}
	})
}

// A destination whose verification meets other bytes than were sent (a
// lying hash tool; a disk that corrupts every write) fails that
// destination with a verification error naming it and the file, and
// nothing is renamed into place.
func TestDestLiarCaught(t *testing.T) {
	suite(t, func(t *testing.T, k destKind) {
		for _, size := range []int64{3000, 3 << 20} {
			src := filepath.Join(t.TempDir(), "w.bin")
			randomFile(t, src, size, 13)
			dst := t.TempDir()
			d := k.liar(t, dst)
			p, err := NewPlan(context.Background(), []string{src}, PlanOptions{ChunkSize: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			_, err = Run(context.Background(), p, []Destination{d}, Options{StateDir: t.TempDir(), Log: testLog(t)})
			if err == nil {
				t.Fatalf("%d bytes: no error", size)
			}
			t.Logf("%d bytes: %v", size, err)
			if errkind.Of(err) != errkind.VerifyFailed || !strings.Contains(err.Error(), d.Name) || !strings.Contains(err.Error(), "w.bin") {
				t.Errorf("%d bytes: %v (kind %v); want a verification failure naming %s and w.bin", size, err, errkind.Of(err), d.Name)
			}
			if _, err := os.Stat(filepath.Join(dst, "w.bin")); err == nil {
				t.Errorf("%d bytes: w.bin is in place", size)
			}
		}
	})
}

func fmtSscan(s string, v *int) (int, error) { return fmt.Sscanf(s, "%d", v) }
