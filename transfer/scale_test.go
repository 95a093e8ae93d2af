package transfer

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/ferry-llm/ferry/internal/killtest"
	"github.com/ferry-llm/ferry/internal/sshdtest"
)

// childSpec is what a transfer child (the test binary run again with
// FERRY_TRANSFER_CHILD) sends: every source under Src to each
// destination, with state in State.
type childSpec struct {
	Src   string      `json:"src"`
	State string      `json:"state"`
	Dests []childDest `json:"dests"`
	// HashLater: the plan's files are hashed as they are sent, as ferry
	// transfer plans them.
	HashLater bool `json:"hash_later"`
}

type childDest struct {
	Name    string `json:"name"`
	Dir     string `json:"dir"`
	Addr    string `json:"addr"`
	User    string `json:"user"`
	Key     string `json:"key"`      // the client's private key file
	HostKey string `json:"host_key"` // authorized_keys form
	Local   bool   `json:"local"`    // a local directory: no SSH
	S3      bool   `json:"s3"`       // Dir is s3://BUCKET/PREFIX (settings from the environment)
}

func init() {
	spec := os.Getenv("FERRY_TRANSFER_CHILD")
	if spec == "" {
		return
	}
	var cs childSpec
	if err := json.Unmarshal([]byte(spec), &cs); err != nil {
		fmt.Fprintln(os.Stderr, "FERRY_TRANSFER_CHILD:", err)
		os.Exit(2)
	}
	if err := runChild(cs); err != nil {
		fmt.Fprintln(os.Stderr, "transfer child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runChild(cs childSpec) error {
	cache := OpenDigestCache(filepath.Join(cs.State, DigestCacheFile))
	var p *Plan
	var err error
	if S3Source(cs.Src) {
		p, err = NewS3Plan(context.Background(), cs.Src, PlanOptions{Cache: cache})
	} else {
		p, err = NewPlan(context.Background(), []string{cs.Src}, PlanOptions{Jobs: 2, Cache: cache, HashLater: cs.HashLater})
	}
	if err != nil {
		return err
	}
	if err := cache.Save(); err != nil {
		return err
	}
	var dests []Destination
	for _, d := range cs.Dests {
		if d.Local || d.S3 {
			dests = append(dests, Destination{Name: d.Name, Dir: d.Dir, Local: d.Local, S3: d.S3})
			continue
		}
		dial, err := keyDialer(d)
		if err != nil {
			return err
		}
		dests = append(dests, Destination{Name: d.Name, Host: "h", Dir: d.Dir, Dial: dial})
	}
	_, err = Run(context.Background(), p, dests, Options{StateDir: cs.State})
	cache.StoreObjects(p)                 // an S3 source's objects hashed as they were read
	if serr := cache.Save(); err == nil { // with what the sending hashed
		err = serr
	}
	return err
}

// keyDialer is testDialer from files, for a child process.
func keyDialer(d childDest) (Dialer, error) {
	pem, err := os.ReadFile(d.Key)
	if err != nil {
		return nil, err
	}
	signer, err := ssh.ParsePrivateKey(pem)
	if err != nil {
		return nil, err
	}
	hk, _, _, _, err := ssh.ParseAuthorizedKey([]byte(d.HostKey))
	if err != nil {
		return nil, err
	}
	cfg := &ssh.ClientConfig{User: d.User, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: ssh.FixedHostKey(hk), Timeout: 10 * time.Second}
	return func(ctx context.Context) (*ssh.Client, error) {
		var nd net.Dialer
		nc, err := nd.DialContext(ctx, "tcp", d.Addr)
		if err != nil {
			return nil, err
		}
		c, chans, reqs, err := ssh.NewClientConn(nc, d.Addr, cfg)
		if err != nil {
			nc.Close()
			return nil, err
		}
		return ssh.NewClient(c, chans, reqs), nil
	}, nil
}

func childDestOf(s *sshdtest.Server, dir string) childDest {
	return childDest{Name: "h:" + dir, Dir: dir, Addr: s.Addr(), User: s.User, Key: s.ClientKeyPath,
		HostKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.HostKey)))}
}

// sftpServerPath is OpenSSH's external sftp-server where this system keeps
// it.
func sftpServerPath(t testing.TB) string {
	for _, p := range []string{"/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server", "/usr/libexec/sftp-server"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	msg := "OpenSSH's sftp-server not found (Debian: apt-get install openssh-server)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// wiredSSHD is a test sshd whose SFTP sessions are OpenSSH's sftp-server
// behind tee, which keeps what the client sent in a file per session:
// the requests a run made, counted at the server.
type wiredSSHD struct {
	*sshdtest.Server
	wire string // the directory of the recordings
}

func startWiredSSHD(t testing.TB, env ...string) *wiredSSHD {
	t.Helper()
	wire := t.TempDir()
	home := t.TempDir()
	tee, err := exec.LookPath("tee")
	if err != nil {
		t.Fatal(err)
	}
	cmd := fmt.Sprintf("%s %s/sftp-$$.bin | %s", tee, wire, sftpServerPath(t))
	s := sshdtest.Start(t, sshdtest.SSHDConfig("SetEnv "+strings.Join(append([]string{"HOME=" + home}, env...), " ")), sshdtest.SFTPServer(cmd))
	return &wiredSSHD{Server: s, wire: wire}
}

// SFTP request types (draft-ietf-secsh-filexfer-02).
const (
	fxpInit     = 1
	fxpOpen     = 3
	fxpClose    = 4
	fxpWrite    = 6
	fxpLstat    = 7
	fxpSetstat  = 9
	fxpOpendir  = 11
	fxpReaddir  = 12
	fxpMkdir    = 14
	fxpStat     = 17
	fxpExtended = 200
)

// requests counts, by type, the SFTP requests recorded so far (each
// session's INIT left out), and the remote commands sshd started.
func (w *wiredSSHD) requests(t testing.TB) (byType map[byte]int, total, commands int) {
	t.Helper()
	byType = map[byte]int{}
	files, _ := filepath.Glob(filepath.Join(w.wire, "sftp-*.bin"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for len(b) >= 5 {
			n := int(binary.BigEndian.Uint32(b))
			if n < 1 || 4+n > len(b) {
				break // a session still writing
			}
			if b[4] != fxpInit {
				byType[b[4]]++
				total++
			}
			b = b[4+n:]
		}
	}
	commands = strings.Count(w.Log(), "Starting session: command")
	return byType, total, commands
}

// reset forgets what was counted so far.
func (w *wiredSSHD) reset(t testing.TB) {
	files, _ := filepath.Glob(filepath.Join(w.wire, "sftp-*.bin"))
	for _, f := range files {
		os.Remove(f)
	}
}

// Thousands of small files to two hosts, the sending process killed with
// SIGKILL at ten random moments and run again each time: the trees end
// identical to the source, with nothing left behind (no partials, no
// journal), and a rerun with nothing to send makes a remote round trip or
// two per host, not one per file or directory.
func TestManySmallFilesKilled(t *testing.T) {
	n := 3000
	if testing.Short() {
		n = 600
	}
	a, b := startSSHD(t), startSSHD(t)
	src := filepath.Join(t.TempDir(), "tree")
	smallTree(t, src, n, 100, 3)
	state := t.TempDir()
	dstA, dstB := t.TempDir(), t.TempDir()
	spec, _ := json.Marshal(childSpec{Src: src, State: state, Dests: []childDest{childDestOf(a, dstA), childDestOf(b, dstB)}})
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "FERRY_TRANSFER_CHILD="+string(spec))
		return cmd
	}
	// An uninterrupted run, timed, into two other directories.
	fa, fb := t.TempDir(), t.TempDir()
	full, _ := json.Marshal(childSpec{Src: src, State: t.TempDir(), Dests: []childDest{childDestOf(a, fa), childDestOf(b, fb)}})
	t0 := time.Now()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "FERRY_TRANSFER_CHILD="+string(full))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("uninterrupted run: %v: %s", err, out)
	}
	took := time.Since(t0)
	t.Logf("an uninterrupted run took %v", took)
	sameTree(t, src, filepath.Join(fa, "tree"))
	sameTree(t, src, filepath.Join(fb, "tree"))

	landed := func() int {
		k := 0
		for _, d := range []string{dstA, dstB} {
			filepath.WalkDir(d, func(p string, de fs.DirEntry, err error) error {
				if err == nil && de.Type().IsRegular() && !strings.HasSuffix(p, ".partial") {
					k++
				}
				return nil
			})
		}
		return k
	}
	finished := func(int) bool { return landed() == 2*n && len(partials(t, dstA))+len(partials(t, dstB)) == 0 }
	killtest.AtRandom(t, 10, took, rand.New(rand.NewPCG(27, 3)), start, func(kill int) bool {
		done := finished(kill)
		t.Logf("kill %d: %d of %d files in place", kill, landed(), 2*n)
		if done {
			// Start the next child from nothing, so that its kill lands
			// in a copy too.
			for _, d := range []string{dstA, dstB} {
				ents, _ := os.ReadDir(d)
				for _, e := range ents {
					os.RemoveAll(filepath.Join(d, e.Name()))
				}
			}
		}
		return done
	}, func() bool { return landed() > 0 })

	if out, err := start().CombinedOutput(); err != nil {
		t.Fatalf("the run after the kills: %v: %s", err, out)
	}
	for _, d := range []string{dstA, dstB} {
		sameTree(t, src, filepath.Join(d, "tree"))
		extra := 0
		filepath.WalkDir(d, func(p string, de fs.DirEntry, err error) error {
			if err == nil && !de.IsDir() {
				if _, serr := os.Stat(filepath.Join(src, "..", mustRel(t, d, p))); serr != nil {
					t.Errorf("left behind at the destination: %s", p)
					extra++
				}
			}
			return nil
		})
	}
	if j, _ := filepath.Glob(filepath.Join(state, "*.journal")); len(j) > 0 {
		t.Errorf("journals left after a complete run: %v", j)
	}
}

func mustRel(t testing.TB, base, p string) string {
	r, err := filepath.Rel(base, p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A rerun with nothing to send decides from one listing per destination
// (a remote command, or SFTP directory reads where the shell has no
// listing tool) and the record of what it verified: its remote round
// trips, counted at the server, grow with the directories, not the files.
// The first run makes each directory once.
func TestNoopRoundTrips(t *testing.T) {
	const files, perDir = 1200, 100
	dirs := files / perDir
	src := filepath.Join(t.TempDir(), "tree")
	smallTree(t, src, files, perDir, 9)
	p, err := NewPlan(context.Background(), []string{src}, PlanOptions{Jobs: 2})
	if err != nil {
		t.Fatal(err)
	}
	// A PATH with the shell's tools but no find or stat: no listing
	// command works, and no hash tool either.
	bare := t.TempDir()
	for _, tool := range []string{"cat", "dd"} {
		if real, err := exec.LookPath(tool); err == nil {
			os.Symlink(real, filepath.Join(bare, tool))
		}
	}
	for _, tc := range []struct {
		name string
		env  []string
		// most round trips a no-op rerun may make
		maxCommands, maxRequests int
	}{
		{name: "listed by a remote command", maxCommands: 1, maxRequests: 0},
		{name: "listed over SFTP", env: []string{"PATH=" + bare}, maxCommands: 1, maxRequests: 6 * (dirs + 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startWiredSSHD(t, tc.env...)
			dst, state := t.TempDir(), t.TempDir()
			d := Destination{Name: "h:" + dst, Host: "h", Dir: dst, Dial: testDialer(s.Server, s.Addr())}
			if _, err := Run(context.Background(), p, []Destination{d}, Options{StateDir: state, Log: testLog(t)}); err != nil {
				t.Fatal(err)
			}
			sameTree(t, src, filepath.Join(dst, "tree"))
			byType, total, commands := s.requests(t)
			t.Logf("first run: %d SFTP requests (%v), %d commands", total, byType, commands)
			if got := byType[fxpMkdir]; got != dirs+1 {
				t.Errorf("the first run made %d directories, want each of the %d once", got, dirs+1)
			}
			s.reset(t)
			before := strings.Count(s.Log(), "Starting session: command")
			rep, err := Run(context.Background(), p, []Destination{d}, Options{StateDir: state, Log: testLog(t)})
			if err != nil {
				t.Fatal(err)
			}
			byType, total, commands = s.requests(t)
			commands -= before
			t.Logf("no-op rerun: %d SFTP requests (%v), %d commands", total, byType, commands)
			if commands > tc.maxCommands || total > tc.maxRequests {
				t.Errorf("a rerun with nothing to send made %d remote commands and %d SFTP requests for %d files in %d directories; want at most %d and %d",
					commands, total, files, dirs, tc.maxCommands, tc.maxRequests)
			}
			h := rep.Hosts[0]
			if h.Sent != 0 {
				t.Errorf("the rerun sent %d bytes", h.Sent)
			}
			for _, f := range h.Files {
				if !f.Verified || !f.Trusted {
					t.Fatalf("%s: not taken as verified by an earlier run: %+v", f.Path, f)
				}
			}
			// The engine's own count agrees with the server's.
			if int(h.Requests) != total || int(h.Commands) != commands {
				t.Errorf("report: %d requests and %d commands; the server saw %d and %d", h.Requests, h.Commands, total, commands)
			}
			// With --verify every file is read again at the destination.
			rep, err = Run(context.Background(), p, []Destination{d}, Options{StateDir: state, Log: testLog(t), Verify: true})
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range rep.Hosts[0].Files {
				if !f.Verified || f.Trusted {
					t.Fatalf("%s: with Verify: %+v", f.Path, f)
				}
			}
		})
	}
}

// A file changed at the destination after it was verified, keeping its
// size, is found by its mtime and sent again; one changed keeping size
// and mtime is rsync's blind spot too, and Verify finds it.
func TestTrustedFileChanged(t *testing.T) {
	s := startSSHD(t)
	src := filepath.Join(t.TempDir(), "m")
	want := randomFile(t, filepath.Join(src, "a.bin"), 5000, 1)
	p, err := NewPlan(context.Background(), []string{src}, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dst, state := t.TempDir(), t.TempDir()
	d := Destination{Name: "h:" + dst, Host: "h", Dir: dst, Dial: testDialer(s, s.Addr())}
	o := Options{StateDir: state, Log: testLog(t)}
	if _, err := Run(context.Background(), p, []Destination{d}, o); err != nil {
		t.Fatal(err)
	}
	remote := filepath.Join(dst, "m", "a.bin")
	bad := append([]byte(nil), want...)
	bad[10] ^= 1
	cases := []struct {
		name   string
		later  time.Duration // the changed file's mtime, after the one it was left with
		verify bool
		fixed  bool
	}{
		{name: "new mtime", later: 5 * time.Second, fixed: true},
		{name: "same mtime", fixed: false},
		{name: "same mtime, verify", verify: true, fixed: true},
	}
	for _, tc := range cases {
		fi, err := os.Stat(remote)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(remote, bad, 0o644)
		os.Chtimes(remote, fi.ModTime().Add(tc.later), fi.ModTime().Add(tc.later))
		o.Verify = tc.verify
		if _, err := Run(context.Background(), p, []Destination{d}, o); err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(remote)
		if fixed := bytes.Equal(got, want); fixed != tc.fixed {
			t.Errorf("%s: repaired %v, want %v", tc.name, fixed, tc.fixed)
		}
		if !tc.fixed {
			os.WriteFile(remote, want, 0o644)
		}
	}
}

// Files at the destination, under the plan's directories, that the plan
// does not hold are reported; with DeleteExtra they are removed (and the
// directories emptied by that), as rsync --delete does, and nothing
// outside the plan's directories is touched.
func TestExtraFiles(t *testing.T) {
	s := startSSHD(t)
	root := t.TempDir()
	src := filepath.Join(root, "quants")
	randomFile(t, filepath.Join(src, "m-Q4_K_M.gguf"), 3000, 1)
	randomFile(t, filepath.Join(src, "m-Q6_K.gguf"), 4000, 2)
	dst, state := t.TempDir(), t.TempDir()
	d := Destination{Name: "h:" + dst, Host: "h", Dir: dst, Dial: testDialer(s, s.Addr())}
	send := func(o Options) *HostReport {
		t.Helper()
		p, err := NewPlan(context.Background(), []string{src}, PlanOptions{})
		if err != nil {
			t.Fatal(err)
		}
		o.StateDir, o.Log = state, testLog(t)
		rep, err := Run(context.Background(), p, []Destination{d}, o)
		if err != nil {
			t.Fatal(err)
		}
		return &rep.Hosts[0]
	}
	send(Options{})
	// Q6_K dropped from the source; a stray file and directory appear at
	// the destination, and a file beside the plan's directory.
	os.Remove(filepath.Join(src, "m-Q6_K.gguf"))
	randomFile(t, filepath.Join(dst, "quants", "old", "x.bin"), 10, 3)
	randomFile(t, filepath.Join(dst, "unrelated.txt"), 10, 4)
	h := send(Options{})
	want := []string{"quants/old/x.bin", "quants/m-Q6_K.gguf", "quants/old"}
	if strings.Join(h.Extra, ",") != strings.Join(want, ",") || len(h.Deleted) != 0 {
		t.Errorf("extra %v, deleted %v; want extra %v and nothing deleted", h.Extra, h.Deleted, want)
	}
	if _, err := os.Stat(filepath.Join(dst, "quants", "m-Q6_K.gguf")); err != nil {
		t.Error("an extra file was removed without DeleteExtra")
	}
	h = send(Options{DeleteExtra: true})
	if strings.Join(h.Deleted, ",") != strings.Join(want, ",") {
		t.Errorf("deleted %v, want %v", h.Deleted, want)
	}
	for _, p := range want {
		if _, err := os.Lstat(filepath.Join(dst, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s is still there", p)
		}
	}
	if _, err := os.Stat(filepath.Join(dst, "unrelated.txt")); err != nil {
		t.Error("a file outside the plan's directories was removed")
	}
	sameTree(t, src, filepath.Join(dst, "quants"))
}
