package transfer

import (
	"context"
	"crypto/sha256"
	"errors"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/internal/digest"
)

// A run killed right after it created a new partial must not leave the
// chunk lines of an earlier partial of the same size in force: the next
// run would take the new partial's zeros for those chunks, find the file
// wrong and repair it, or worse trust them.
func TestNewPartialDropsOldChunks(t *testing.T) {
	s := startSSHD(t)
	src := filepath.Join(t.TempDir(), "w.bin")
	const cs = 64 << 10
	data := randomFile(t, src, 8*cs, 5)
	ctx := context.Background()
	p, err := NewPlan(ctx, []string{src}, PlanOptions{ChunkSize: cs})
	if err != nil {
		t.Fatal(err)
	}
	dst, state := t.TempDir(), t.TempDir()
	d := Destination{Name: "t:" + dst, Host: "t", Dir: dst, Dial: testDialer(s, s.Addr())}
	o := Options{StateDir: state, Streams: 1, Log: testLog(t)}

	// An earlier run journaled a partial and its first four chunks; the
	// partial is gone since (removed, or its disk replaced).
	o.defaults(p.ChunkSize)
	h := newHost(ctx, d, p, &o)
	if err := h.openJournal(); err != nil {
		t.Fatal(err)
	}
	h.journal(jPartial{rel: "w.bin", size: 8 * cs})
	for i := range 4 {
		s := sha256.Sum256(data[i*cs : (i+1)*cs])
		h.journal(jChunk{rel: "w.bin", chunk: i, end: int64(i+1) * cs, digest: digest.New(s[:])})
	}
	h.jl.Close()

	// This run creates a new partial and dies right then.
	killed := errors.New("killed after creating the partial")
	hookPartialCreated = func(string) error { return killed }
	_, err = Run(ctx, p, []Destination{d}, Options{StateDir: state, Streams: 1, Log: testLog(t)})
	hookPartialCreated = nil
	if !errors.Is(err, killed) {
		t.Fatalf("run with the kill: %v", err)
	}
	if got := partials(t, dst); len(got) != 1 {
		t.Fatalf("partials after the kill: %v", got)
	}

	// The next run owes every chunk to the new partial, and repairs none.
	rep, err := Run(ctx, p, []Destination{d}, Options{StateDir: state, Streams: 1, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	f := rep.Hosts[0].Files[0]
	if f.Sent != 8*cs || f.Repaired != 0 {
		t.Errorf("after the kill the run sent %d bytes (want %d) and repaired %d chunks (want 0)", f.Sent, 8*cs, f.Repaired)
	}
	sameTree(t, filepath.Dir(src), dst)
}
