package main

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	crand "crypto/rand"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/ferry-llm/ferry/internal/s3test"
	"github.com/ferry-llm/ferry/internal/sshdtest"
	"github.com/ferry-llm/ferry/transfer"
)

// startTransferSSHD starts the test sshd with a HOME of its own for its
// sessions, so the remote hash commands do not source the machine's shell
// rc files (a ~/.bashrc initialising pyenv cost 5 s per command on one).
func startTransferSSHD(t *testing.T) *sshdtest.Server {
	return sshdtest.Start(t, sshdtest.SSHDConfig("SetEnv HOME="+t.TempDir()))
}

func writeRandom(t testing.TB, path string, n int, seed uint64) []byte {
	t.Helper()
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 1))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

func transferReport(t *testing.T, r ferryRun) transfer.Report {
	t.Helper()
	var rep transfer.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("--json output: %v\n%s\nstderr: %s", err, r.stdout, r.stderr)
	}
	return rep
}

func TestTransferCLI(t *testing.T) {
	s := startTransferSSHD(t)
	src := filepath.Join(t.TempDir(), "model")
	want := writeRandom(t, filepath.Join(src, "model.gguf"), 1<<20+5, 1)
	writeRandom(t, filepath.Join(src, "config.json"), 300, 2)
	if err := os.Symlink("model.gguf", filepath.Join(src, "latest.gguf")); err != nil {
		t.Fatal(err)
	}
	dst, state := t.TempDir(), t.TempDir()
	base := []string{"transfer", "--ssh-config", s.ConfigPath, "--state-dir", state, "--json"}

	// A file in a directory that is not there yet, and a fan-out to a
	// second destination whose directory is a file: that one fails, the
	// first finishes, exit 2 (bad input), and the report says which.
	notDir := filepath.Join(dst, "notdir")
	os.WriteFile(notDir, []byte("x"), 0o644)
	good := s.Alias + ":" + filepath.Join(dst, "a", "b")
	bad := s.Alias + ":" + notDir
	r := execFerry(t, nil, append(base, src, good, bad)...)
	if r.code != exitBadInput {
		t.Fatalf("exit %d, want %d; stderr: %s", r.code, exitBadInput, r.stderr)
	}
	rep := transferReport(t, r)
	if len(rep.Hosts) != 2 || !rep.Hosts[0].OK || rep.Hosts[1].OK || !strings.Contains(r.stderr, bad) {
		t.Fatalf("report %+v, stderr %s", rep, r.stderr)
	}
	got, err := os.ReadFile(filepath.Join(dst, "a", "b", "model", "model.gguf"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("remote file differs (%v)", err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "a", "b", "model", "latest.gguf")); err != nil || l != "model.gguf" {
		t.Errorf("link: %q, %v", l, err)
	}
	for _, f := range rep.Hosts[0].Files {
		if !f.Verified || f.Digest == "" {
			t.Errorf("file %+v not verified", f)
		}
	}

	// Again: nothing is sent.
	r = execFerry(t, nil, append(base, src, good)...)
	if r.code != 0 {
		t.Fatalf("rerun: exit %d: %s", r.code, r.stderr)
	}
	if rep := transferReport(t, r); rep.Hosts[0].Sent != 0 {
		t.Errorf("rerun sent %d bytes", rep.Hosts[0].Sent)
	}

	// Usage: no destination, exit 2.
	if r := execFerry(t, nil, "transfer", src); r.code != exitBadInput {
		t.Errorf("no destination: exit %d", r.code)
	}
}

// A host key that does not match known_hosts, and a key the server does
// not accept, each fail before anything is written, naming the host.
func TestTransferCLIRefused(t *testing.T) {
	s := startTransferSSHD(t)
	src := filepath.Join(t.TempDir(), "w.bin")
	writeRandom(t, src, 1000, 3)
	dst := t.TempDir()

	_, other, _ := ed25519.GenerateKey(crand.Reader)
	otherPub, _ := ssh.NewPublicKey(other.Public())
	wrongKH := filepath.Join(t.TempDir(), "known_hosts")
	os.WriteFile(wrongKH, []byte(knownhosts.Line([]string{knownhosts.Normalize(s.Addr())}, otherPub)+"\n"), 0o600)

	stranger := filepath.Join(t.TempDir(), "id_stranger")
	if _, err := sshdtest.WriteKey(stranger, other, nil); err != nil {
		t.Fatal(err)
	}
	strangerCfg := filepath.Join(t.TempDir(), "ssh_config")
	block := strings.Replace(s.HostBlock(s.Alias), s.ClientKeyPath, stranger, 1)
	os.WriteFile(strangerCfg, []byte(block), 0o600)

	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"host key mismatch", []string{"--ssh-config", s.ConfigPath, "--known-hosts", wrongKH}, exitVerify, "HOST KEY CHANGED"},
		{"auth failure", []string{"--ssh-config", strangerCfg}, exitFailure, "auth"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string{"transfer", "--state-dir", t.TempDir()}, tc.args...), src, s.Alias+":"+dst)
			r := execFerry(t, nil, args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) || !strings.Contains(r.stderr, s.Alias+":"+dst) {
				t.Errorf("exit %d (want %d), stderr %q (want %q and the destination)", r.code, tc.code, r.stderr, tc.want)
			}
			if ents, _ := os.ReadDir(dst); len(ents) != 0 {
				t.Errorf("destination has %d entries", len(ents))
			}
		})
	}
}

// Out-of-range tuning flags are usage errors (exit 2) that name the flag,
// refused before any connection or hashing.
func TestTransferCLIUsage(t *testing.T) {
	src := filepath.Join(t.TempDir(), "w.bin")
	writeRandom(t, src, 1000, 3)
	for _, tc := range []struct{ flag, value string }{
		{"--streams", "0"},
		{"--streams", "65"},
		{"--sessions", "0"},
		{"--sessions", "17"},
		{"--chunk-size", "1KiB"},
	} {
		t.Run(tc.flag+"="+tc.value, func(t *testing.T) {
			r := execFerry(t, nil, "transfer", "--state-dir", t.TempDir(), tc.flag, tc.value, src, "nosuchhost.invalid:/x")
			if r.code != exitBadInput || !strings.Contains(r.stderr, tc.flag) {
				t.Errorf("exit %d (want %d), stderr %q (want it to name %s)", r.code, exitBadInput, r.stderr, tc.flag)
			}
		})
	}
}

// ferry transfer SIGKILLed at random moments, and run again after each,
// ends with the file byte-identical, and no run sends a chunk that the
// journal said was already there when it started.
func TestTransferKillAtRandomPoints(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a transfer 10 times; not in -short")
	}
	s := startTransferSSHD(t)
	src := filepath.Join(t.TempDir(), "w.bin")
	const size = 3<<20 + 11
	const cs = 64 << 10
	want := writeRandom(t, src, size, 9)
	dst, state := t.TempDir(), t.TempDir()
	dest := s.Alias + ":" + dst
	journalPath := transfer.JournalPath(state, dest)
	ferry := func(state, dest string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "--verbose", "transfer", "--ssh-config", s.ConfigPath, "--state-dir", state,
			"--chunk-size", strconv.Itoa(cs), "--streams", "2", src, dest)
		cmd.Env = append(os.Environ(), "FERRY_INSPECT_TEST_AS_MAIN=1")
		return cmd
	}
	run := func() *exec.Cmd { return ferry(state, dest) }
	// An uninterrupted run to a directory of its own, to time it.
	start := time.Now()
	if b, err := ferry(t.TempDir(), s.Alias+":"+t.TempDir()).CombinedOutput(); err != nil {
		t.Fatalf("uninterrupted run: %v: %s", err, b)
	}
	full := time.Since(start)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 7))
	t.Logf("seed %d, uninterrupted run %v", seed, full)
	resumed, finished := 0, 0
	// stale: how many lines of the journal describe a w.bin that the test
	// deleted. A run killed after its rename but before it removed the
	// journal leaves its chunk lines behind; their partial is gone, so the
	// runs after rightly send those chunks again (a new partial line then
	// follows them).
	stale := 0
	for kill := 0; kill < 10; kill++ {
		before := journaledChunks(journalPath, stale)
		cmd := run()
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = pw
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pw.Close()
		// Most kills land after a random number of chunks were started
		// (inside the copy, wherever it resumed from); the others at a
		// random time (before the first chunk, in the final check, around
		// the rename).
		after := -1
		if rng.IntN(3) > 0 {
			after = 1 + rng.IntN(max(((size+cs-1)/cs-len(before))*2/3, 1))
		} else {
			go func() { time.Sleep(time.Duration(rng.Int64N(int64(full)))); cmd.Process.Signal(syscall.SIGKILL) }()
		}
		var log strings.Builder
		sc := bufio.NewScanner(pr)
		n := 0
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), `msg="transfer: sending chunk"`) {
				if n++; n == after {
					cmd.Process.Signal(syscall.SIGKILL)
				}
			}
		}
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		pr.Close()
		if len(before) > 0 {
			resumed++
		}
		for _, c := range sentChunks(log.String()) {
			if before[c] {
				t.Fatalf("kill %d: chunk %d was journaled before the run and sent again", kill, c)
			}
		}
		if b, err := os.ReadFile(filepath.Join(dst, "w.bin")); err == nil {
			if !bytes.Equal(b, want) {
				t.Fatalf("kill %d: w.bin is there and differs", kill)
			}
			// Finished before the kill: start over, so that the next kills
			// fall inside a copy again.
			finished++
			os.Remove(filepath.Join(dst, "w.bin"))
			stale = journalLines(journalPath)
		} else if _, err := os.Stat(journalPath); err != nil {
			stale = 0
		}
	}
	before := journaledChunks(journalPath, stale)
	cmd := run()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("final run: %v: %s", err, stderr.String())
	}
	sent := sentChunks(stderr.String())
	for _, c := range sent {
		if before[c] {
			t.Fatalf("final run: chunk %d was journaled and sent again", c)
		}
	}
	got, err := os.ReadFile(filepath.Join(dst, "w.bin"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("final file differs (%v)", err)
	}
	if _, err := os.Stat(journalPath); err == nil {
		t.Error("the journal is still there after a finished transfer")
	}
	t.Logf("runs that found a journal: %d; killed runs that had finished: %d; the final run sent %d of %d chunks", resumed, finished, len(sent), (size+cs-1)/cs)
	if resumed < 2 {
		t.Errorf("only %d runs found a journal to resume from", resumed)
	}
}

// journaledChunks reads the chunk lines of a transfer journal (its format
// is documented in transfer/journal.go), leaving out those among its first
// skip lines.
func journaledChunks(path string, skip int) map[int]bool {
	out := map[int]bool{}
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for line := 0; sc.Scan(); line++ {
		var e struct{ Unit string }
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			break
		}
		if line < skip {
			continue
		}
		if strings.HasPrefix(e.Unit, "p:") {
			out = map[int]bool{}
		}
		if _, idx, ok := strings.Cut(e.Unit, "#"); ok && strings.HasPrefix(e.Unit, "c:") {
			if i, err := strconv.Atoi(idx); err == nil {
				out[i] = true
			}
		}
	}
	return out
}

// journalLines counts the whole lines of the journal at path (0: none).
func journalLines(path string) int {
	b, _ := os.ReadFile(path)
	return bytes.Count(b, []byte("\n"))
}

// sentChunks reads the chunks a run started sending from its debug log.
func sentChunks(log string) []int {
	var out []int
	for _, l := range strings.Split(log, "\n") {
		if !strings.Contains(l, `msg="transfer: sending chunk"`) {
			continue
		}
		i := strings.Index(l, " chunk=")
		if i < 0 {
			continue
		}
		f := strings.Fields(l[i+7:])
		if n, err := strconv.Atoi(f[0]); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// Ctrl-C in the middle of a copy: exit 130, the words say how to resume,
// nothing under the file's name; the same command then finishes it.
func TestTransferSIGINT(t *testing.T) {
	s := startTransferSSHD(t)
	src := filepath.Join(t.TempDir(), "w.bin")
	want := writeRandom(t, src, 2<<20, 4)
	dst, state := t.TempDir(), t.TempDir()
	args := []string{"--verbose", "transfer", "--ssh-config", s.ConfigPath, "--state-dir", state, "--chunk-size", "64KiB", "--streams", "1", src, s.Alias + ":" + dst}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "FERRY_INSPECT_TEST_AS_MAIN=1")
	pr, pw, _ := os.Pipe()
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	var log strings.Builder
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		log.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), `msg="transfer: sending chunk"`) && strings.Contains(sc.Text(), "chunk=3 ") {
			cmd.Process.Signal(os.Interrupt)
		}
	}
	cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != exitInterrupted || !strings.Contains(log.String(), "run the same command again to resume") {
		t.Fatalf("exit %d, want %d; stderr:\n%s", code, exitInterrupted, log.String())
	}
	if _, err := os.Stat(filepath.Join(dst, "w.bin")); err == nil {
		t.Fatal("w.bin is there after Ctrl-C")
	}
	r := execFerry(t, nil, args[1:]...)
	got, err := os.ReadFile(filepath.Join(dst, "w.bin"))
	if r.code != 0 || err != nil || !bytes.Equal(got, want) {
		t.Fatalf("rerun: exit %d, %v: %s", r.code, err, r.stderr)
	}
}

// A destination that fails is reported once: its summary line says
// FAILED, and the error (printed by main, on stderr) says why; no log
// line repeats it.
func TestTransferFailurePrintedOnce(t *testing.T) {
	s := startTransferSSHD(t)
	src := filepath.Join(t.TempDir(), "w.bin")
	writeRandom(t, src, 1000, 3)
	dst := t.TempDir()
	notDir := filepath.Join(dst, "notdir")
	os.WriteFile(notDir, []byte("x"), 0o644)
	r := execFerry(t, nil, "transfer", "--ssh-config", s.ConfigPath, "--state-dir", t.TempDir(), src, s.Alias+":"+notDir, s.Alias+":"+filepath.Join(dst, "ok"))
	if r.code != exitBadInput {
		t.Fatalf("exit %d, want %d: %s", r.code, exitBadInput, r.stderr)
	}
	out := r.stdout + r.stderr
	if n := strings.Count(out, "exists and is not a directory"); n != 1 {
		t.Errorf("the failure is printed %d times, want once:\n%s", n, out)
	}
	if !strings.Contains(r.stdout, s.Alias+":"+notDir+": FAILED") || !strings.Contains(r.stdout, s.Alias+":"+filepath.Join(dst, "ok")+": ok") {
		t.Errorf("stdout does not give each destination's line:\n%s", r.stdout)
	}
}

// Files at the destination that the source tree does not have are listed,
// and --delete-extra removes them.
func TestTransferDeleteExtra(t *testing.T) {
	s := startTransferSSHD(t)
	src := filepath.Join(t.TempDir(), "quants")
	writeRandom(t, filepath.Join(src, "m-Q4_K_M.gguf"), 1000, 1)
	dst, state := t.TempDir(), t.TempDir()
	writeRandom(t, filepath.Join(dst, "quants", "m-Q6_K.gguf"), 1000, 2)
	args := []string{"transfer", "--ssh-config", s.ConfigPath, "--state-dir", state, src, s.Alias + ":" + dst}
	r := execFerry(t, nil, args...)
	if r.code != 0 || !strings.Contains(r.stdout, "1 files there that the sources do not have (--delete-extra removes them): quants/m-Q6_K.gguf") {
		t.Fatalf("exit %d; stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = execFerry(t, nil, append([]string{"transfer", "--delete-extra"}, args[1:]...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "deleted 1 files") {
		t.Fatalf("exit %d; stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(dst, "quants", "m-Q6_K.gguf")); err == nil {
		t.Error("the extra file is still there")
	}
}

// Destinations of both kinds in one command: a host over SSH and local
// directories after it, each source chunk read once; a local directory
// alone as the last argument, as cp takes it; and a read-only local
// directory failing alone, naming itself and the file.
func TestTransferCLILocal(t *testing.T) {
	s := startTransferSSHD(t)
	src := filepath.Join(t.TempDir(), "model")
	want := writeRandom(t, filepath.Join(src, "model.gguf"), 3<<20+5, 4)
	writeRandom(t, filepath.Join(src, "config.json"), 300, 5)
	remote, local, state := t.TempDir(), t.TempDir(), t.TempDir()
	ro := filepath.Join(t.TempDir(), "ro")
	os.Mkdir(ro, 0o755)
	if os.Geteuid() == 0 {
		if out, err := exec.Command("chattr", "+i", ro).CombinedOutput(); err != nil {
			t.Skipf("chattr +i: %v: %s", err, out)
		}
		t.Cleanup(func() { exec.Command("chattr", "-i", ro).Run() })
	} else {
		os.Chmod(ro, 0o555)
	}
	base := []string{"transfer", "--ssh-config", s.ConfigPath, "--state-dir", state, "--json", "--chunk-size", "1MiB"}
	r := execFerry(t, nil, append(base, src, s.Alias+":"+remote, local, "file://"+ro)...)
	if r.code == 0 {
		t.Fatalf("exit 0 with a read-only destination; stderr: %s", r.stderr)
	}
	rep := transferReport(t, r)
	if len(rep.Hosts) != 3 || !rep.Hosts[0].OK || !rep.Hosts[1].OK || rep.Hosts[2].OK {
		t.Fatalf("report: %+v", rep)
	}
	if !strings.Contains(r.stderr, ro) || !strings.Contains(r.stderr, "model") {
		t.Errorf("stderr %q does not name the read-only destination and the file", r.stderr)
	}
	if rep.Hosts[1].HashCommand != "re-read" {
		t.Errorf("local destination verified by %q, want re-read", rep.Hosts[1].HashCommand)
	}
	for _, d := range []string{remote, local} {
		got, err := os.ReadFile(filepath.Join(d, "model", "model.gguf"))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: file differs (%v)", d, err)
		}
	}
	if ents, _ := os.ReadDir(ro); len(ents) != 0 {
		t.Errorf("the read-only destination holds %d entries", len(ents))
	}
	// A local destination inside the source, or where the source would
	// land on itself: refused before anything is hashed or written.
	for dst, want := range map[string]string{filepath.Join(src, "backup"): "is inside source", filepath.Dir(src): "onto itself"} {
		r = execFerry(t, nil, "transfer", "--state-dir", state, src, dst)
		if r.code != exitBadInput || !strings.Contains(r.stderr, want) {
			t.Errorf("destination %s: exit %d, stderr %q", dst, r.code, r.stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(src, "backup")); err == nil {
		t.Error("the refused destination was made")
	}
	// The local directory alone, last: nothing to send.
	r = execFerry(t, nil, "transfer", "--state-dir", state, "--json", src, local)
	if r.code != 0 {
		t.Fatalf("local rerun: exit %d: %s", r.code, r.stderr)
	}
	if rep := transferReport(t, r); len(rep.Hosts) != 1 || rep.Hosts[0].Sent != 0 || rep.Hosts[0].Dir != local {
		t.Errorf("local rerun: %+v", rep)
	}
}

// ferry transfer to an S3 prefix beside a local directory: both get the
// files, settings read from the standard AWS_* variables; a bucket that
// does not exist fails that destination alone, exit 2, naming it.
func TestTransferCLIS3(t *testing.T) {
	srv := s3test.Start(t, "cli")
	srv.Env(t)
	src := filepath.Join(t.TempDir(), "model")
	want := writeRandom(t, filepath.Join(src, "model.gguf"), 6<<20+5, 4)
	writeRandom(t, filepath.Join(src, "config.json"), 300, 5)
	local, state := t.TempDir(), t.TempDir()
	r := execFerry(t, nil, "transfer", "--state-dir", state, "--json", "--chunk-size", "5MiB", src, "s3://cli/m", local)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	rep := transferReport(t, r)
	if len(rep.Hosts) != 2 || !rep.Hosts[0].OK || !rep.Hosts[1].OK || rep.Hosts[0].Dir != "s3://cli/m" {
		t.Fatalf("report: %+v", rep)
	}
	for _, p := range []string{srv.ObjectPath("cli", "m/model/model.gguf"), filepath.Join(local, "model", "model.gguf")} {
		if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: file differs (%v)", p, err)
		}
	}
	r = execFerry(t, nil, "transfer", "--state-dir", state, "--json", src, "s3://nosuchbucket/m", t.TempDir())
	if r.code != 2 || !strings.Contains(r.stderr, "s3://nosuchbucket/m") || !strings.Contains(r.stderr, "does not exist") {
		t.Errorf("missing bucket: exit %d, stderr %q; want 2 naming the destination", r.code, r.stderr)
	}
	if rep := transferReport(t, r); len(rep.Hosts) != 2 || rep.Hosts[0].OK || !rep.Hosts[1].OK {
		t.Errorf("missing bucket: want the local directory done: %+v", rep)
	}
}

// ferry transfer s3://BUCKET/PREFIX/NAME DEST...: the objects under NAME/
// to a local directory, verified; a rerun sends nothing; a missing bucket
// or prefix exits 2 having written nothing.
func TestTransferCLIFromS3(t *testing.T) {
	srv := s3test.Start(t, "cli")
	srv.Env(t)
	src := filepath.Join(t.TempDir(), "model")
	want := writeRandom(t, filepath.Join(src, "model.gguf"), 6<<20+5, 4)
	writeRandom(t, filepath.Join(src, "config.json"), 300, 5)
	if r := execFerry(t, nil, "transfer", "--state-dir", t.TempDir(), "--chunk-size", "5MiB", src, "s3://cli/m"); r.code != 0 {
		t.Fatalf("upload: exit %d: %s", r.code, r.stderr)
	}
	local, state := t.TempDir(), t.TempDir()
	for run := range 2 {
		r := execFerry(t, nil, "transfer", "--state-dir", state, "--json", "--chunk-size", "1MiB", "s3://cli/m/model", local)
		if r.code != 0 {
			t.Fatalf("run %d: exit %d: %s", run, r.code, r.stderr)
		}
		rep := transferReport(t, r)
		if len(rep.Hosts) != 1 || !rep.Hosts[0].OK || len(rep.Hosts[0].Files) != 2 || (run == 1) != (rep.Hosts[0].Sent == 0) {
			t.Fatalf("run %d: report: %+v", run, rep)
		}
	}
	cfg, _ := os.ReadFile(filepath.Join(src, "config.json"))
	for name, b := range map[string][]byte{"model.gguf": want, "config.json": cfg} {
		if got, err := os.ReadFile(filepath.Join(local, "model", name)); err != nil || !bytes.Equal(got, b) {
			t.Fatalf("%s differs (%v)", name, err)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"s3://nosuchbucket/m/model"}, "does not exist"},
		{[]string{"s3://cli/m/nothing"}, "no object there"},
	} {
		dst := t.TempDir()
		args := append(append([]string{"transfer", "--state-dir", t.TempDir()}, tc.args...), dst)
		r := execFerry(t, nil, args...)
		if ents, _ := os.ReadDir(dst); r.code != 2 || !strings.Contains(r.stderr, tc.want) || len(ents) != 0 {
			t.Errorf("%v: exit %d, stderr %q, %d entries written; want 2 and %q", tc.args, r.code, r.stderr, len(ents), tc.want)
		}
	}
}
