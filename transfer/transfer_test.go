package transfer

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

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
