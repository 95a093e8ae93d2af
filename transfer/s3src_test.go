package transfer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
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

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/killtest"
	"github.com/ferry-llm/ferry/internal/s3test"
)

// The source side of the suite: a tree in a bucket (as ferry uploads it,
// with each file's sha256 in its metadata, and objects put by another tool,
// with none) copied to every destination kind but S3 (whose settings would
// name the same server: TestS3SourceToS3 covers it).

// stageS3 starts versitygw with bucket "src", sets the environment to it,
// and puts the local tree src there under s3://src/m/ as ferry transfer
// does; the files untagged (relative to src's parent) are put again by a
// plain PutObject, with no metadata.
func stageS3(t *testing.T, src string, untagged ...string) *s3test.Server {
	t.Helper()
	srv := s3test.Start(t, "src")
	srv.Env(t)
	p, err := NewPlan(context.Background(), []string{src}, PlanOptions{ChunkSize: 5 << 20})
	if err != nil {
		t.Fatal(err)
	}
	d := Destination{Name: "s3://src/m", Dir: "s3://src/m", S3: true}
	if _, err := Run(context.Background(), p, []Destination{d}, Options{StateDir: t.TempDir(), Log: testLog(t)}); err != nil {
		t.Fatal(err)
	}
	for _, rel := range untagged {
		putPlain(t, srv, "m/"+rel, filepath.Join(filepath.Dir(src), filepath.FromSlash(rel)))
	}
	return srv
}

// putPlain puts the file local as the object key of bucket "src", with
// no metadata.
func putPlain(t *testing.T, srv *s3test.Server, key, local string) {
	t.Helper()
	b, err := os.ReadFile(local)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Client().PutObject(context.Background(), &s3api.PutObjectInput{Bucket: aws.String("src"), Key: aws.String(key), Body: bytes.NewReader(b)}); err != nil {
		t.Fatal(err)
	}
}

// srcTree writes the tree the source tests copy: a file of several chunks
// at 1 MiB, one untagged of several chunks, small ones and an empty one.
func srcTree(t *testing.T) string {
	src := filepath.Join(t.TempDir(), "model")
	randomFile(t, filepath.Join(src, "a.bin"), 5<<20+123, 1)
	randomFile(t, filepath.Join(src, "raw.bin"), 3<<20+5, 4)
	randomFile(t, filepath.Join(src, "sub", "b.bin"), 70000, 2)
	randomFile(t, filepath.Join(src, "sub", "plain.json"), 300, 3)
	randomFile(t, filepath.Join(src, "empty"), 0, 5)
	return src
}

func sha256Of(t *testing.T, p string) digest.Digest {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return digest.New(s[:])
}

// A fresh copy from a bucket, a rerun that reads and sends nothing (the
// digests of untagged objects remembered by ETag), and one with Verify
// that re-hashes at the destination and sends nothing either.
func TestS3SourceFreshAndNoop(t *testing.T) {
	for _, k := range destKinds()[:2] { // sftp, local
		t.Run(k.name, func(t *testing.T) {
			src := srcTree(t)
			stageS3(t, src, "model/raw.bin", "model/sub/plain.json")
			dst := filepath.Join(t.TempDir(), "not", "yet")
			state := t.TempDir()
			ctx := context.Background()
			var reads atomic.Int64
			hookSourceRead = func(string, int64) { reads.Add(1) }
			t.Cleanup(func() { hookSourceRead = nil })
			d := k.dest(t, dst)
			for run, verify := range []bool{false, false, true} {
				reads.Store(0)
				cache := OpenDigestCache(filepath.Join(state, DigestCacheFile))
				p, err := NewS3Plan(ctx, "s3://src/m/model", PlanOptions{ChunkSize: 1 << 20, Cache: cache})
				if err != nil {
					t.Fatal(err)
				}
				if len(p.Files) != 5 || p.Files[0].Rel != "model/a.bin" || p.Files[0].Digest != sha256Of(t, filepath.Join(src, "a.bin")) {
					t.Fatalf("plan: %+v", p.Files)
				}
				rep, err := Run(ctx, p, []Destination{d}, Options{StateDir: state, Log: testLog(t), Verify: verify})
				if err != nil {
					t.Fatal(err)
				}
				cache.StoreObjects(p)
				if err := cache.Save(); err != nil {
					t.Fatal(err)
				}
				sameTree(t, src, filepath.Join(dst, "model"))
				if got := k.halfWritten(t, dst); len(got) > 0 {
					t.Errorf("partials left: %v", got)
				}
				h := rep.Hosts[0]
				for _, fr := range h.Files {
					if want := sha256Of(t, filepath.Join(filepath.Dir(src), fr.Path)); fr.Digest != want || !fr.Verified {
						t.Errorf("run %d: %s: digest %s verified %v, want %s", run, fr.Path, fr.Digest, fr.Verified, want)
					}
				}
				switch {
				case run == 0 && (h.Sent != p.Bytes() || reads.Load() != 6+3+4):
					t.Errorf("fresh copy: sent %d of %d, %d pieces read (want 13)", h.Sent, p.Bytes(), reads.Load())
				case run > 0 && (h.Sent != 0 || reads.Load() != 0):
					t.Errorf("rerun (verify %v): sent %d, read %d pieces; want nothing", verify, h.Sent, reads.Load())
				}
			}
		})
	}
}

// S3 to S3 (another bucket of the same server) and to a local directory
// at once: each chunk read once for both. An untagged object larger than
// a chunk cannot go to S3 yet (its metadata is given before it is read):
// that file alone fails there, not built, and the rest arrives.
func TestS3SourceToS3(t *testing.T) {
	src := srcTree(t)
	srv := stageS3(t, src, "model/raw.bin", "model/sub/plain.json")
	if err := srv.MakeBucket(context.Background(), "dst"); err != nil {
		t.Fatal(err)
	}
	local := t.TempDir()
	dests := []Destination{{Name: local, Dir: local, Local: true}, {Name: "s3://dst/x", Dir: "s3://dst/x", S3: true}}
	p, err := NewS3Plan(context.Background(), "s3://src/m/model", PlanOptions{ChunkSize: 5 << 20})
	if err != nil {
		t.Fatal(err)
	}
	reads := countSourceReads(t)
	rep, err := Run(context.Background(), p, dests, Options{StateDir: t.TempDir(), Log: testLog(t)})
	// At 5 MiB chunks raw.bin is one chunk: every file goes to both.
	if err != nil {
		t.Fatal(err)
	}
	sameTree(t, src, filepath.Join(local, "model"))
	sameTree(t, src, srv.ObjectPath("dst", "x/model"))
	for k, n := range reads {
		if n != 1 {
			t.Errorf("%s read %d times for two destinations", k, n)
		}
	}
	if len(reads) != 5+1 { // a.bin is 2 chunks
		t.Errorf("%d pieces read, want 6: %v", len(reads), reads)
	}
	for _, h := range rep.Hosts {
		if !h.OK {
			t.Errorf("%s failed: %s", h.Destination, h.Error)
		}
	}
	// At 1 MiB chunks (a.bin 6, raw.bin 4): raw.bin's sha256 is known
	// only once read, and S3 needs it when the upload begins.
	hookSourceRead = nil
	big := filepath.Join(t.TempDir(), "model")
	randomFile(t, filepath.Join(big, "raw.bin"), 6<<20, 9)
	putPlain(t, srv, "m2/model/raw.bin", filepath.Join(big, "raw.bin"))
	p, err = NewS3Plan(context.Background(), "s3://src/m2/model", PlanOptions{ChunkSize: 5 << 20})
	if err != nil {
		t.Fatal(err)
	}
	local2 := t.TempDir()
	rep, err = Run(context.Background(), p, []Destination{{Name: local2, Dir: local2, Local: true}, {Name: "s3://dst/y", Dir: "s3://dst/y", S3: true}}, Options{StateDir: t.TempDir(), Log: testLog(t)})
	if err == nil || errkind.Of(err) != errkind.NotBuilt || !strings.Contains(err.Error(), "s3://dst/y") {
		t.Fatalf("want not built for s3://dst/y, got %v", err)
	}
	if !rep.Hosts[0].OK {
		t.Errorf("the local directory failed: %s", rep.Hosts[0].Error)
	}
	sameTree(t, big, filepath.Join(local2, "model"))
}

// A copy cancelled midway resumes and fetches only the chunks its
// destinations lack (the file's digest is known: from its metadata).
func TestS3SourceResumeFetchesMissing(t *testing.T) {
	src := filepath.Join(t.TempDir(), "model")
	want := randomFile(t, filepath.Join(src, "w.bin"), 12<<20, 11)
	stageS3(t, src)
	for _, k := range destKinds()[:2] {
		t.Run(k.name, func(t *testing.T) {
			dst := t.TempDir()
			state := t.TempDir()
			d := k.dest(t, dst)
			p, err := NewS3Plan(context.Background(), "s3://src/m/model", PlanOptions{ChunkSize: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			var seen atomic.Int64
			_, err = Run(ctx, p, []Destination{d}, Options{StateDir: state, Log: testLog(t), Streams: 1, Sessions: 1,
				Progress: func(string, int64) progressReporter {
					return &cancelAt{n: &seen, at: int64(len(want)) / 2, cancel: cancel}
				}})
			if !errors.Is(err, ErrInterrupted) {
				t.Fatalf("want the run interrupted, got %v", err)
			}
			var reads atomic.Int64
			hookSourceRead = func(string, int64) { reads.Add(1) }
			t.Cleanup(func() { hookSourceRead = nil })
			p, err = NewS3Plan(context.Background(), "s3://src/m/model", PlanOptions{ChunkSize: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			rep, err := Run(context.Background(), p, []Destination{d}, Options{StateDir: state, Log: testLog(t)})
			if err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(filepath.Join(dst, "model", "w.bin"))
			if !bytes.Equal(got, want) {
				t.Fatal("w.bin differs after the resume")
			}
			fr := rep.Hosts[0].Files[0]
			t.Logf("resume: %d of 12 chunks read, %d bytes sent", reads.Load(), fr.Sent)
			if !fr.Resumed || reads.Load() >= 12 || fr.Sent >= int64(len(want)) || reads.Load()*(1<<20) < fr.Sent {
				t.Errorf("want a resumed file with fewer than its 12 chunks read; read %d, %+v", reads.Load(), fr)
			}
		})
	}
}

// An object replaced while it is copied: that file fails at both
// destinations with an error naming the object and each destination,
// nothing of it is renamed into place, and the other files arrive.
func TestS3SourceChangedMidCopy(t *testing.T) {
	src := srcTree(t)
	srv := stageS3(t, src)
	s := startSSHD(t)
	for _, victim := range []string{"model/a.bin", "model/sub/b.bin"} {
		t.Run(filepath.Base(victim), func(t *testing.T) {
			hostDir, localDir := t.TempDir(), t.TempDir()
			dests := []Destination{
				{Name: "h:" + hostDir, Host: "h", Dir: hostDir, Dial: testDialer(s, s.Addr())},
				{Name: localDir, Dir: localDir, Local: true},
			}
			p, err := NewS3Plan(context.Background(), "s3://src/m/model", PlanOptions{ChunkSize: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			other := filepath.Join(t.TempDir(), "other")
			randomFile(t, other, 1000, 99)
			if p.small(&p.Files[indexOfRel(p, victim)]) {
				// Replaced after the listing, before its one GET.
				putPlain(t, srv, "m/"+victim, other)
			} else {
				// Replaced as its first chunk is fetched.
				var once sync.Once
				hookSourceRead = func(rel string, off int64) {
					if rel == victim {
						once.Do(func() { putPlain(t, srv, "m/"+victim, other) })
					}
				}
			}
			t.Cleanup(func() { hookSourceRead = nil; putPlain(t, srv, "m/"+victim, filepath.Join(filepath.Dir(src), victim)) })
			rep, err := Run(context.Background(), p, dests, Options{StateDir: t.TempDir(), Log: testLog(t)})
			if err == nil {
				t.Fatal("no error")
			}
			t.Logf("error: %v", err)
			if !errors.Is(err, ErrSourceChanged) || errkind.Of(err) != errkind.BadInput {
				t.Errorf("kind %v, want source changed (bad input)", errkind.Of(err))
			}
			for _, d := range dests {
				if !strings.Contains(err.Error(), d.Name+": "+victim) {
					t.Errorf("the error does not name %s: %s", d.Name, victim)
				}
			}
			if !strings.Contains(err.Error(), "s3://src/m/"+victim) {
				t.Errorf("the error does not name the object s3://src/m/%s", victim)
			}
			for i, dir := range []string{hostDir, localDir} {
				h := rep.Hosts[i]
				if h.OK {
					t.Errorf("%s: reported OK", h.Destination)
				}
				for _, fr := range h.Files {
					_, err := os.Stat(filepath.Join(dir, fr.Path))
					switch {
					case fr.Path == victim && (fr.Verified || err == nil):
						t.Errorf("%s: %s is in place", h.Destination, victim)
					case fr.Path != victim && (!fr.Verified || err != nil):
						t.Errorf("%s: %s did not arrive: %v", h.Destination, fr.Path, err)
					}
				}
			}
		})
	}
}

// A source that cannot be listed is an error of the right kind naming it,
// before anything is written.
func TestS3SourceBadCases(t *testing.T) {
	srv := s3test.Start(t, "bad")
	cases := []struct {
		name string
		url  string
		env  map[string]string
		kind errkind.Kind
		want string
	}{
		{name: "no such bucket", url: "s3://nosuchbucket/x", kind: errkind.BadInput, want: `bucket "nosuchbucket" does not exist`},
		{name: "credentials refused", url: "s3://bad/x", env: map[string]string{"AWS_SECRET_ACCESS_KEY": "wrong"}, kind: errkind.Usage, want: "refused the credentials"},
		{name: "nothing there", url: "s3://bad/nothing/here", kind: errkind.BadInput, want: "no object there or under it"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv.Env(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, err := NewS3Plan(context.Background(), tc.url, PlanOptions{})
			if err == nil {
				t.Fatal("no error")
			}
			t.Logf("error: %v", err)
			if k := errkind.Of(err); k != tc.kind || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("kind %v, %q; want %v, %q", k, err, tc.kind, tc.want)
			}
		})
	}
	t.Run("unsafe key", func(t *testing.T) {
		srv.Env(t)
		if _, err := srv.Client().PutObject(context.Background(), &s3api.PutObjectInput{Bucket: aws.String("bad"), Key: aws.String(`m/x\\y`), Body: strings.NewReader("x")}); err != nil {
			t.Skipf("the server refuses the key: %v", err)
		}
		_, err := NewS3Plan(context.Background(), "s3://bad/m", PlanOptions{})
		if errkind.Of(err) != errkind.BadInput || !strings.Contains(err.Error(), `s3://bad/m/x\\y`) {
			t.Errorf("want bad input naming s3://bad/m/x\\y, got %v", err)
		}
	})
}

// The fetching process killed with SIGKILL at random moments (to a local
// directory and an SSH host at once) and run again each time: both end
// with the tree, nothing half-written left, no journal.
func TestS3SourceKilled(t *testing.T) {
	src := filepath.Join(t.TempDir(), "tree")
	smallTree(t, src, 200, 50, 7)
	randomFile(t, filepath.Join(src, "big.bin"), 20<<20+17, 9) // 2 chunks of the default 16 MiB
	stageS3(t, src, "tree/d000/f00000.bin")
	kinds := destKinds()[:2]
	state := t.TempDir()
	hostDir, localDir := t.TempDir(), t.TempDir()
	dests := []childDest{kinds[0].child(t, hostDir), kinds[1].child(t, localDir)}
	spec, _ := json.Marshal(childSpec{Src: "s3://src/m/tree", State: state, Dests: dests})
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "FERRY_TRANSFER_CHILD="+string(spec))
		return cmd
	}
	full, _ := json.Marshal(childSpec{Src: "s3://src/m/tree", State: t.TempDir(), Dests: []childDest{kinds[0].child(t, t.TempDir()), kinds[1].child(t, t.TempDir())}})
	t0 := time.Now()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "FERRY_TRANSFER_CHILD="+string(full))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("uninterrupted run: %v: %s", err, out)
	}
	took := time.Since(t0)
	landed := func(dir string) int {
		n := 0
		filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
			if err == nil && de.Type().IsRegular() && !strings.HasSuffix(p, ".partial") {
				n++
			}
			return nil
		})
		return n
	}
	killtest.AtRandom(t, 4, took, rand.New(rand.NewPCG(31, 7)), start, func(kill int) bool {
		done := landed(hostDir) == 201 && landed(localDir) == 201 && len(partials(t, hostDir))+len(partials(t, localDir)) == 0
		t.Logf("kill %d: %d and %d of 201 files in place", kill, landed(hostDir), landed(localDir))
		if done {
			for _, dir := range []string{hostDir, localDir} {
				ents, _ := os.ReadDir(dir)
				for _, e := range ents {
					os.RemoveAll(filepath.Join(dir, e.Name()))
				}
			}
		}
		return done
	}, func() bool {
		return landed(hostDir)+landed(localDir) > 0 || len(partials(t, hostDir))+len(partials(t, localDir)) > 0
	})
	if out, err := start().CombinedOutput(); err != nil {
		t.Fatalf("the run after the kills: %v: %s", err, out)
	}
	for _, dir := range []string{hostDir, localDir} {
		sameTree(t, src, filepath.Join(dir, "tree"))
		if got := partials(t, dir); len(got) > 0 {
			t.Errorf("partials left: %v", got)
		}
	}
	if j, _ := filepath.Glob(filepath.Join(state, "*.journal")); len(j) > 0 {
		t.Errorf("journals left after a complete run: %v", j)
	}
}

func indexOfRel(p *Plan, rel string) int {
	for i, f := range p.Files {
		if f.Rel == rel {
			return i
		}
	}
	panic(rel)
}
