package transfer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/ferry-llm/ferry/internal/sshdtest"
)

// smallTree writes n files of 1 B to 64 KiB (sizes drawn from a fixed
// seed) under root, in directories of perDir files, and returns their
// total size.
func smallTree(tb testing.TB, root string, n, perDir int, seed uint64) int64 {
	tb.Helper()
	r := rand.New(rand.NewPCG(seed, seed+1))
	var total int64
	buf := make([]byte, 64<<10)
	for i := range n {
		dir := filepath.Join(root, fmt.Sprintf("d%03d", i/perDir))
		if i%perDir == 0 {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				tb.Fatal(err)
			}
		}
		size := 1 + r.IntN(64<<10)
		for k := 0; k < size; k++ {
			buf[k] = byte(r.Uint32())
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d.bin", i)), buf[:size], 0o644); err != nil {
			tb.Fatal(err)
		}
		total += int64(size)
	}
	return total
}

// benchSSHConfig writes an ssh_config naming the sshd s behind addr
// "bench", with its host key known and the cipher ferry prefers, so
// that rsync and scp use the same server, key and cipher as ferry.
func benchSSHConfig(b *testing.B, s *sshdtest.Server, hostKeyLine string, addr string) string {
	cfg := filepath.Join(b.TempDir(), "ssh_config")
	_, port, _ := strings.Cut(addr, ":")
	kh := filepath.Join(b.TempDir(), "known_hosts")
	if err := os.WriteFile(kh, []byte(hostKeyLine+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	block := s.HostBlock("bench", "Port "+port, "UserKnownHostsFile "+kh, "Ciphers aes128-gcm@openssh.com")
	if err := os.WriteFile(cfg, []byte(block), 0o600); err != nil {
		b.Fatal(err)
	}
	return cfg
}

// BenchmarkTransferTree copies a tree of FERRY_TREE_FILES small files
// (default 5000, of 1 B to 64 KiB, FERRY_TREE_PER_DIR a directory, default
// 500) to a real sshd on
// loopback, straight (direct) and through a proxy adding 20 ms each way
// (rtt=40ms): ferry, rsync -a and scp -r (FERRY_TREE_TOOLS, a comma
// list, picks some: scp makes a round trip a file and takes about 15
// minutes at 40 ms), with the same key, server and
// cipher, into an empty directory (fresh); then ferry and rsync again
// with nothing to send (noop: ferry plans again with its digest cache and
// trusts what it verified, rsync's quick check). It reports seconds per
// run and each tool's ratio to rsync (x-rsync: rsync's time / the tool's;
// above 1 is faster than rsync). Targets: fresh ≥ 0.5 (≤ 2× rsync's time)
// and ≥ scp's ratio; noop ≥ 0.5.
func BenchmarkTransferTree(b *testing.B) {
	n := 5000
	if v := os.Getenv("FERRY_TREE_FILES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatal(err)
		}
	}
	for _, tool := range []string{"scp", "rsync"} {
		if _, err := exec.LookPath(tool); err != nil {
			b.Fatalf("%s not found (Debian: apt-get install openssh-client rsync)", tool)
		}
	}
	perDir := 500
	if v := os.Getenv("FERRY_TREE_PER_DIR"); v != "" {
		var err error
		if perDir, err = strconv.Atoi(v); err != nil {
			b.Fatal(err)
		}
	}
	s := startSSHD(b)
	src := filepath.Join(b.TempDir(), "tree")
	total := smallTree(b, src, n, perDir, 7)
	b.Logf("%d files, %d bytes", n, total)
	for _, lat := range []int{-1, 20} {
		proxy, label := s.Addr(), "direct"
		if lat >= 0 {
			proxy, _ = startProxy(b, s.Addr(), lat)
			label = fmt.Sprintf("rtt=%dms", 2*lat)
		}
		cfg := benchSSHConfig(b, s, knownhosts.Line([]string{knownhosts.Normalize(proxy)}, s.HostKey), proxy)
		secs := map[string]float64{}
		for _, tool := range treeTools() {
			b.Run(label+"/fresh/"+tool, func(b *testing.B) {
				var all, cpu, srv float64
				for i := 0; i < b.N; i++ {
					dst := b.TempDir()
					sessionsEnded(s.Pid())
					c0 := clientCPU(tool)
					_, s0, _ := procCPU(s.Pid())
					t := time.Now()
					runTool(b, tool, cfg, s, proxy, src, dst, b.TempDir())
					all += time.Since(t).Seconds()
					cpu += clientCPU(tool) - c0
					sessionsEnded(s.Pid())
					_, s1, _ := procCPU(s.Pid())
					srv += s1 - s0
				}
				report(b, secs, tool, all/float64(b.N))
				b.ReportMetric(cpu/float64(b.N), "cpu-s/run")
				b.ReportMetric(srv/float64(b.N), "sshd-cpu-s/run")
			})
		}
		for _, tool := range []string{"rsync", "ferry"} {
			b.Run(label+"/noop/"+tool, func(b *testing.B) {
				dst, state := b.TempDir(), b.TempDir()
				runTool(b, tool, cfg, s, proxy, src, dst, state)
				var all float64
				for i := 0; i < b.N; i++ {
					sessionsEnded(s.Pid())
					t := time.Now()
					runTool(b, tool, cfg, s, proxy, src, dst, state)
					all += time.Since(t).Seconds()
				}
				report(b, secs, "noop-"+tool, all/float64(b.N))
			})
		}
	}
}

func report(b *testing.B, secs map[string]float64, tool string, s float64) {
	secs[tool] = s
	b.ReportMetric(s, "s/run")
	ref := "rsync"
	if strings.HasPrefix(tool, "noop-") {
		ref = "noop-rsync"
	}
	if r := secs[ref]; r > 0 {
		b.ReportMetric(r/s, "x-rsync")
	}
}

// runTool copies src into dst with tool; ferry plans src (with its
// digest cache in state) and runs there.
func runTool(b *testing.B, tool, cfg string, s *sshdtest.Server, addr, src, dst, state string) {
	switch tool {
	case "rsync":
		if out, err := exec.Command("rsync", "-a", "-e", "ssh -F "+cfg, src, "bench:"+dst+"/").CombinedOutput(); err != nil {
			b.Fatalf("rsync: %v: %s", err, out)
		}
	case "scp":
		if out, err := exec.Command("scp", "-q", "-r", "-F", cfg, src, "bench:"+dst+"/").CombinedOutput(); err != nil {
			b.Fatalf("scp: %v: %s", err, out)
		}
	case "ferry":
		cache := OpenDigestCache(filepath.Join(state, DigestCacheFile))
		p, err := NewPlan(context.Background(), []string{src}, PlanOptions{Jobs: 4, Cache: cache})
		if err != nil {
			b.Fatal(err)
		}
		if err := cache.Save(); err != nil {
			b.Fatal(err)
		}
		d := Destination{Name: "bench:" + dst, Host: "bench", Dir: dst, Dial: testDialer(s, addr)}
		if _, err := Run(context.Background(), p, []Destination{d}, Options{StateDir: state}); err != nil {
			b.Fatal(err)
		}
	}
}

// clientCPU is the CPU seconds of the client side of tool so far: this
// process for ferry, its reaped children (the tool and the ssh it runs)
// for the others.
func clientCPU(tool string) float64 {
	if tool == "ferry" {
		return cpuSeconds(syscall.RUSAGE_SELF)
	}
	return cpuSeconds(syscall.RUSAGE_CHILDREN)
}

// BenchmarkNoopModel reruns a finished transfer of a model-shaped tree
// (FERRY_NOOP_MODEL_SIZE bytes, default 2 GB, in 12 shards and 2 small
// files, as a 27B checkpoint is laid out) to two hosts (two sshd), straight
// and through 40 ms of round trip: what a user pays to rerun `ferry
// transfer` or a pipeline's transfer with nothing to send. Each timed run
// plans again (its digest cache saves the hashing) and runs; the first,
// untimed, sends everything. Target: ≤ 1 s at any RTT.
func BenchmarkNoopModel(b *testing.B) {
	size := int64(2e9)
	if v := os.Getenv("FERRY_NOOP_MODEL_SIZE"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		size = n
	}
	src := filepath.Join(b.TempDir(), "model")
	if err := os.MkdirAll(src, 0o755); err != nil {
		b.Fatal(err)
	}
	shard := size / 12
	for i := range 12 {
		writeRandomStream(b, filepath.Join(src, fmt.Sprintf("model-%05d-of-00012.safetensors", i+1)), shard)
	}
	randomFile(b, filepath.Join(src, "config.json"), 2000, 1)
	randomFile(b, filepath.Join(src, "model.safetensors.index.json"), 60000, 2)
	servers := []*sshdtest.Server{startSSHD(b), startSSHD(b)}
	for _, lat := range []int{-1, 20} {
		label := "direct"
		if lat >= 0 {
			label = fmt.Sprintf("rtt=%dms", 2*lat)
		}
		state := b.TempDir()
		var dests []Destination
		for k, s := range servers {
			addr := s.Addr()
			if lat >= 0 {
				addr, _ = startProxy(b, s.Addr(), lat)
			}
			dst := b.TempDir()
			dests = append(dests, Destination{Name: fmt.Sprintf("h%d:%s", k, dst), Host: fmt.Sprintf("h%d", k), Dir: dst, Dial: testDialer(s, addr)})
		}
		run := func() *Report {
			cache := OpenDigestCache(filepath.Join(state, DigestCacheFile))
			p, err := NewPlan(context.Background(), []string{src}, PlanOptions{Jobs: 4, Cache: cache})
			if err != nil {
				b.Fatal(err)
			}
			if err := cache.Save(); err != nil {
				b.Fatal(err)
			}
			rep, err := Run(context.Background(), p, dests, Options{StateDir: state})
			if err != nil {
				b.Fatal(err)
			}
			return rep
		}
		run()
		b.Run(label, func(b *testing.B) {
			var all float64
			for i := 0; i < b.N; i++ {
				t := time.Now()
				rep := run()
				all += time.Since(t).Seconds()
				for _, h := range rep.Hosts {
					if h.Sent != 0 {
						b.Fatalf("%s: a no-op rerun sent %d bytes", h.Destination, h.Sent)
					}
				}
			}
			b.ReportMetric(all/float64(b.N), "s/run")
		})
	}
}

// treeTools are the tools BenchmarkTransferTree compares (rsync first: the
// ratios are to it).
func treeTools() []string {
	if v := os.Getenv("FERRY_TREE_TOOLS"); v != "" {
		return strings.Split(v, ",")
	}
	return []string{"rsync", "scp", "ferry"}
}
