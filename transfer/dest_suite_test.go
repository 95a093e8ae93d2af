package transfer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
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

	"github.com/aws/aws-sdk-go-v2/aws"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/killtest"
	"github.com/ferry-llm/ferry/internal/s3test"
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

	// view is where this machine sees what the destination at dir holds
	// (nil: dir itself).
	view func(dir string) string
	// copiesLinks: a link arrives as a copy of the file it points to.
	copiesLinks bool
	// noModes: the destination keeps no file modes.
	noModes bool
	// minChunk is the smallest chunk size the destination takes.
	minChunk int64
	// alter changes one byte at off of the partial of rel, which holds
	// want, at the destination at dir, behind ferry's back (nil: the
	// partial file in view(dir)).
	alter func(t *testing.T, dir, rel string, off, cs int64, want []byte)
	// leftovers lists what the destination at dir holds half-written
	// besides the *.partial files in view(dir) (nil: nothing).
	leftovers func(t *testing.T, dir string) []string
}

func (k destKind) viewOf(dir string) string {
	if k.view == nil {
		return dir
	}
	return k.view(dir)
}

// chunk is cs, or the kind's smallest chunk size if that is larger.
func (k destKind) chunk(cs int64) int64 { return max(cs, k.minChunk) }

// halfWritten lists the partials and other half-written things the
// destination at dir holds.
func (k destKind) halfWritten(t *testing.T, dir string) []string {
	out := partials(t, k.viewOf(dir))
	if k.leftovers != nil {
		out = append(out, k.leftovers(t, dir)...)
	}
	return out
}

// destKinds are the destination kinds: every test of the suite runs on
// each.
func destKinds() []destKind {
	var once, lonce, sonce sync.Once
	var srv, liar *sshdtest.Server
	sshd := func(t *testing.T) *sshdtest.Server {
		once.Do(func() { srv = startSSHD(t) })
		return srv
	}
	// One versitygw for the s3 subtest; the destination at dir is the
	// prefix dir in its bucket, whose objects are files under its posix
	// root: Root/BUCKET/dir/REL.
	const bucket = "ferry-dest"
	var s3srv *s3test.Server
	s3 := func(t *testing.T) *s3test.Server {
		sonce.Do(func() {
			s3srv = s3test.Start(t, bucket)
			s3srv.Env(t) // the settings every S3 tool reads, inherited by child processes
		})
		return s3srv
	}
	s3url := func(dir string) string {
		return "s3://" + bucket + "/" + strings.TrimPrefix(filepath.ToSlash(dir), "/")
	}
	s3dest := func(t *testing.T, dir string) Destination {
		s3(t)
		return Destination{Name: s3url(dir), Dir: s3url(dir), S3: true}
	}
	s3key := func(dir, rel string) string { return strings.TrimPrefix(filepath.ToSlash(dir), "/") + "/" + rel }
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
				localWriteHook = flipOne
				t.Cleanup(func() { localWriteHook = nil })
				return Destination{Name: dir, Dir: dir, Local: true}
			},
			verifier: localVerifier,
		},
		{
			name: "s3",
			dest: s3dest,
			child: func(t *testing.T, dir string) childDest {
				s3(t)
				return childDest{Name: s3url(dir), Dir: s3url(dir), S3: true}
			},
			// The honest S3 analogue of a lying destination: every body
			// reaches the server with a byte flipped after its SHA-256 was
			// computed (a link or proxy that garbles data), and the server
			// refuses each put and part whose x-amz-checksum-sha256 does not
			// match (BadDigest); nothing appears under the key.
			liar: func(t *testing.T, dir string) Destination {
				s3WriteHook = flipOne
				t.Cleanup(func() { s3WriteHook = nil })
				return s3dest(t, dir)
			},
			verifier:    s3Verifier,
			view:        func(dir string) string { return filepath.Join(s3srv.Root, bucket, dir) },
			copiesLinks: true,
			noModes:     true,
			minChunk:    s3MinPart,
			// A part of the upload under way replaced, through the S3 API,
			// by other bytes with their own right checksum (S3 lets nothing
			// else touch an upload): ListParts then gives that part's
			// SHA-256, which the resume compares with the chunk's.
			alter: func(t *testing.T, dir, rel string, off, cs int64, want []byte) {
				c := s3srv.Client()
				ctx := context.Background()
				key := s3key(dir, rel)
				ups, err := c.ListMultipartUploads(ctx, &s3api.ListMultipartUploadsInput{Bucket: aws.String(bucket), Prefix: aws.String(key)})
				if err != nil || len(ups.Uploads) != 1 {
					t.Fatalf("uploads of %s: %v, %v", key, ups, err)
				}
				i := off / cs
				body := append([]byte(nil), want[i*cs:min(int64(len(want)), (i+1)*cs)]...)
				body[off-i*cs] ^= 0xff
				sum := sha256.Sum256(body)
				if _, err := c.UploadPart(ctx, &s3api.UploadPartInput{Bucket: aws.String(bucket), Key: aws.String(key), UploadId: ups.Uploads[0].UploadId,
					PartNumber: aws.Int32(int32(i + 1)), Body: bytes.NewReader(body), ChecksumSHA256: aws.String(base64.StdEncoding.EncodeToString(sum[:])),
					ChecksumAlgorithm: s3types.ChecksumAlgorithmSha256}); err != nil {
					t.Fatal(err)
				}
			},
			leftovers: func(t *testing.T, dir string) []string {
				out, err := s3srv.Client().ListMultipartUploads(context.Background(), &s3api.ListMultipartUploadsInput{Bucket: aws.String(bucket), Prefix: aws.String(s3key(dir, ""))})
				if err != nil {
					t.Fatal(err)
				}
				var ups []string
				for _, u := range out.Uploads {
					ups = append(ups, "upload of "+aws.ToString(u.Key))
				}
				return ups
			},
		},
	}
}

// flipOne is a write hook under which every write lands with one byte
// flipped.
func flipOne(rel string, off int64, data []byte) []byte {
	b := append([]byte(nil), data...)
	if len(b) > 0 {
		b[len(b)/2] ^= 0x40
	}
	return b
}

// suite runs f on every destination kind.
func suite(t *testing.T, f func(t *testing.T, k destKind)) {
	for _, k := range destKinds() {
		t.Run(k.name, func(t *testing.T) { f(t, k) })
	}
}

// A fresh copy of a tree (a file of many chunks, a small one, an empty
// one, a link), then a rerun that sends nothing, and one with Verify that
// re-hashes and sends nothing either; with the sources hashed before the
// run and, as ferry transfer plans them, as they are sent (each rerun
// planned again: the files found there are hashed before deciding).
func TestDestFreshAndNoop(t *testing.T) {
	suite(t, func(t *testing.T, k destKind) {
		k.dest(t, t.TempDir()) // the kind's server, for both subtests
		for _, later := range []bool{false, true} {
			t.Run(fmt.Sprintf("hashLater=%v", later), func(t *testing.T) { freshAndNoop(t, k, later) })
		}
	})
}

func freshAndNoop(t *testing.T, k destKind, later bool) {
	src := filepath.Join(t.TempDir(), "model")
	randomFile(t, filepath.Join(src, "a.bin"), 5<<20+123, 1)
	randomFile(t, filepath.Join(src, "sub", "b.bin"), 70000, 2)
	randomFile(t, filepath.Join(src, "empty"), 0, 3)
	if err := os.Symlink("sub/b.bin", filepath.Join(src, "link.bin")); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "not", "yet")
	ctx := context.Background()
	plan := func() *Plan {
		p, err := NewPlan(ctx, []string{src}, PlanOptions{ChunkSize: k.chunk(1 << 20), HashLater: later})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := plan()
	d := k.dest(t, dst)
	state := t.TempDir()
	rep, err := Run(ctx, p, []Destination{d}, Options{StateDir: state, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	sameTreeOf(t, src, filepath.Join(k.viewOf(dst), "model"), k.copiesLinks)
	if got := k.halfWritten(t, dst); len(got) > 0 {
		t.Errorf("partials left: %v", got)
	}
	h := rep.Hosts[0]
	if !h.OK || h.Sent != p.Bytes() || len(h.Files) != 3 || !strings.HasPrefix(h.HashCommand, k.verifier) {
		t.Errorf("report: %+v", h)
	}
	for _, fr := range h.Files {
		if want := fileDigest(t, filepath.Join(filepath.Dir(src), filepath.FromSlash(fr.Path))); fr.Digest != want || !fr.Verified {
			t.Errorf("report of %s: digest %s, verified %v; want %s", fr.Path, fr.Digest, fr.Verified, want)
		}
	}
	fi, err := os.Stat(filepath.Join(k.viewOf(dst), "model", "a.bin"))
	if err != nil || (!k.noModes && fi.Mode().Perm() != 0o644) {
		t.Errorf("a.bin: %v, %v; want mode 0644", fi, err)
	}
	for _, verify := range []bool{false, true} {
		if later {
			p = plan()
		}
		rep, err = Run(ctx, p, []Destination{d}, Options{StateDir: state, Log: testLog(t), Verify: verify})
		if err != nil {
			t.Fatal(err)
		}
		if h := rep.Hosts[0]; h.Sent != 0 || !h.OK {
			t.Errorf("rerun (verify %v) sent %d bytes: %+v", verify, h.Sent, h)
		}
	}
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
		spec, _ := json.Marshal(childSpec{Src: src, State: state, Dests: []childDest{k.child(t, dst)}, HashLater: true})
		start := func() *exec.Cmd {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "FERRY_TRANSFER_CHILD="+string(spec))
			return cmd
		}
		full, _ := json.Marshal(childSpec{Src: src, State: t.TempDir(), Dests: []childDest{k.child(t, t.TempDir())}, HashLater: true})
		t0 := time.Now()
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "FERRY_TRANSFER_CHILD="+string(full))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("uninterrupted run: %v: %s", err, out)
		}
		took := time.Since(t0)
		view := k.viewOf(dst)
		landed := func() int {
			n := 0
			filepath.WalkDir(view, func(p string, de fs.DirEntry, err error) error {
				if err == nil && de.Type().IsRegular() && !strings.HasSuffix(p, ".partial") {
					n++
				}
				return nil
			})
			return n
		}
		killtest.AtRandom(t, 4, took, rand.New(rand.NewPCG(30, uint64(len(k.name)))), start, func(kill int) bool {
			done := landed() == 201 && len(k.halfWritten(t, dst)) == 0
			t.Logf("kill %d: %d of 201 files in place", kill, landed())
			if done {
				ents, _ := os.ReadDir(view)
				for _, e := range ents {
					os.RemoveAll(filepath.Join(view, e.Name()))
				}
			}
			return done
		}, func() bool { return landed() > 0 || len(k.halfWritten(t, dst)) > 0 })
		if out, err := start().CombinedOutput(); err != nil {
			t.Fatalf("the run after the kills: %v: %s", err, out)
		}
		sameTree(t, src, filepath.Join(view, "tree"))
		if got := k.halfWritten(t, dst); len(got) > 0 {
			t.Errorf("partials left: %v", got)
		}
		for _, pat := range []string{"*.journal", "*.s3uploads"} {
			if j, _ := filepath.Glob(filepath.Join(state, pat)); len(j) > 0 {
				t.Errorf("journals left after a complete run: %v", j)
			}
		}
	})
}

// A chunk of a partial altered between an interrupted run and its resume
// is found and sent again, alone.
func TestDestRepairAlteredChunk(t *testing.T) {
	suite(t, func(t *testing.T, k destKind) {
		src := filepath.Join(t.TempDir(), "w.bin")
		cs := k.chunk(256 << 10)
		size := int64(3 << 20) // 12 chunks
		if cs > 256<<10 {
			size = 3*cs + 4096 // 4 chunks (the last holds the byte at 1000 too): each chunk sent costs time
		}
		want := randomFile(t, src, size, 12)
		dst := t.TempDir()
		state := t.TempDir()
		p, err := NewPlan(context.Background(), []string{src}, PlanOptions{ChunkSize: cs, HashLater: true})
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
		if k.alter != nil {
			k.alter(t, dst, "w.bin", at, cs, want)
		} else {
			f, err := os.OpenFile(filepath.Join(dst, "w.bin.partial"), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteAt([]byte{want[at] ^ 0xff}, at)
			f.Close()
		}
		// Planned again, as ferry transfer does each run: the same stamps,
		// the same journal.
		if p, err = NewPlan(context.Background(), []string{src}, PlanOptions{ChunkSize: cs, HashLater: true}); err != nil {
			t.Fatal(err)
		}
		rep, err := Run(context.Background(), p, []Destination{d}, Options{StateDir: state, Log: testLog(t)})
		if err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(filepath.Join(k.viewOf(dst), "w.bin"))
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
		cs := k.chunk(1 << 20)
		for _, size := range []int64{3000, 3 * cs} {
			src := filepath.Join(t.TempDir(), "w.bin")
			randomFile(t, src, size, 13)
			dst := t.TempDir()
			d := k.liar(t, dst)
			p, err := NewPlan(context.Background(), []string{src}, PlanOptions{ChunkSize: cs, HashLater: true})
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
			if _, err := os.Stat(filepath.Join(k.viewOf(dst), "w.bin")); err == nil {
				t.Errorf("%d bytes: w.bin is in place", size)
			}
		}
	})
}

func fmtSscan(s string, v *int) (int, error) { return fmt.Sscanf(s, "%d", v) }
