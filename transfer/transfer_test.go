package transfer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestSendTree(t *testing.T) {
	s := startSSHD(t)
	src := filepath.Join(t.TempDir(), "model")
	randomFile(t, filepath.Join(src, "a.bin"), 5<<20+123, 1)
	randomFile(t, filepath.Join(src, "sub", "b.bin"), 70000, 2)
	randomFile(t, filepath.Join(src, "empty"), 0, 3)
	if err := os.Symlink("sub/b.bin", filepath.Join(src, "link.bin")); err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	ctx := context.Background()
	p, err := NewPlan(ctx, []string{src}, PlanOptions{ChunkSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	d := Destination{Name: "t:" + dst, Host: "t", Dir: dst, Dial: testDialer(s, s.Addr())}
	rep, err := Run(ctx, p, []Destination{d}, Options{StateDir: t.TempDir(), Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	sameTree(t, src, filepath.Join(dst, "model"))
	if got := partials(t, dst); len(got) > 0 {
		t.Errorf("partials left: %v", got)
	}
	h := rep.Hosts[0]
	if !h.OK || h.Sent != p.Bytes() || len(h.Files) != 3 {
		t.Errorf("report: %+v", h)
	}
	// The remote host has dd and a sha256 tool: checked chunk by chunk.
	if !strings.HasPrefix(h.HashCommand, "dd | ") {
		t.Errorf("verified with %q, want chunk by chunk (dd | …)", h.HashCommand)
	}
	// Again: nothing is sent, every file is verified where it is.
	rep, err = Run(ctx, p, []Destination{d}, Options{StateDir: t.TempDir(), Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	if h := rep.Hosts[0]; h.Sent != 0 {
		t.Errorf("second run sent %d bytes", h.Sent)
	}
}

// The pre-flight check (netcheck) runs once per host, however many
// destinations are on it and however many files go there.
func TestPreFlightOncePerHost(t *testing.T) {
	s := startSSHD(t)
	src := filepath.Join(t.TempDir(), "m")
	for i := range 20 {
		randomFile(t, filepath.Join(src, fmt.Sprintf("f%02d", i)), 1000, uint64(i))
	}
	p, err := NewPlan(context.Background(), []string{src}, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	checks := map[string]int{}
	var dests []Destination
	for _, host := range []string{"a", "a", "b"} {
		dst := t.TempDir()
		dests = append(dests, Destination{Name: host + ":" + dst, Host: host, Dir: dst, Dial: testDialer(s, s.Addr())})
	}
	_, err = Run(context.Background(), p, dests, Options{StateDir: t.TempDir(), Log: testLog(t),
		PreFlight: func(ctx context.Context, d Destination) error {
			mu.Lock()
			checks[d.Host]++
			mu.Unlock()
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if checks["a"] != 1 || checks["b"] != 1 {
		t.Errorf("pre-flight checks by host: %v, want one each", checks)
	}
}

// Files are sent a directory at a time in turn, each directory's in plan
// order.
func TestSendOrder(t *testing.T) {
	p := &Plan{}
	for _, rel := range []string{"m/a/1", "m/a/2", "m/a/3", "m/b/1", "m/top", "m/c/1", "m/c/2"} {
		p.Files = append(p.Files, File{Rel: rel})
	}
	var got []string
	for _, i := range p.sendOrder() {
		got = append(got, p.Files[i].Rel)
	}
	want := "m/a/1 m/b/1 m/top m/c/1 m/a/2 m/c/2 m/a/3"
	if strings.Join(got, " ") != want {
		t.Errorf("order %v, want %s", got, want)
	}
}
