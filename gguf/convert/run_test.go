package convert

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/safetensors"
)

// interruptRun runs Run into out and cancels it once n tensors are
// written, as Ctrl-C would.
func interruptRun(t *testing.T, ck *safetensors.Checkpoint, p *Plan, out string, n int32, noSync bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var done atomic.Int32
	_, err := Run(ctx, ck, p, out, RunOptions{Jobs: 1, NoSync: noSync, TensorDone: func(int, string) {
		if done.Add(1) == n {
			cancel()
		}
	}})
	if err == nil {
		t.Fatal("the interrupted run finished")
	}
	for _, f := range []string{out + ".partial", out + ".journal"} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("interrupted run left no %s: %v", f, err)
		}
	}
}

// Run resumes an interrupted conversion from the tensors its journal holds
// and ends byte-identical to an uninterrupted one, leaving only the file;
// other options, or a partial file gone, start over. A run without fsync
// (NoSync) resumes in the same boot, and starts over after a reboot (its
// unsynced pages may be gone) or when the other run syncs and it does not.
func TestRunResume(t *testing.T) {
	ck, err := safetensors.OpenDir(qwen35Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	p, err := NewPlan(ck, Options{OutType: OutF16})
	if err != nil {
		t.Fatal(err)
	}
	ref := filepath.Join(t.TempDir(), "ref.gguf")
	refRes, err := Run(t.Context(), ck, p, ref, RunOptions{Digest: true})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(ref)
	for _, tc := range []struct {
		name          string
		other         bool // resumed with other options
		dropPartial   bool
		first, second bool // NoSync of the interrupted run and of the rerun
		reboot        bool // a reboot between them
		wantResumed   bool
	}{
		{name: "same conversion", wantResumed: true},
		{name: "other outtype", other: true},
		{name: "partial gone", dropPartial: true},
		{name: "no-sync, same boot", first: true, second: true, wantResumed: true},
		{name: "no-sync, after a reboot", first: true, second: true, reboot: true},
		{name: "no-sync, then synced", first: true},
		{name: "synced, then no-sync", second: true},
		{name: "synced, after a reboot", reboot: true, wantResumed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "m.gguf")
			interruptRun(t, ck, p, out, 10, tc.first)
			if tc.dropPartial {
				os.Remove(out + ".partial")
			}
			if tc.reboot {
				boot := fsutil.BootID
				fsutil.BootID = func() string { return "boot after the one of the first run" }
				t.Cleanup(func() { fsutil.BootID = boot })
			}
			q := p
			if tc.other {
				if q, err = NewPlan(ck, Options{OutType: OutBF16}); err != nil {
					t.Fatal(err)
				}
			}
			res, err := Run(t.Context(), ck, q, out, RunOptions{Digest: true, NoSync: tc.second})
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantResumed != (res.Resumed >= 10) || !tc.wantResumed && res.Resumed != 0 {
				t.Errorf("resumed %d tensors (10 were durable), want resumed %v", res.Resumed, tc.wantResumed)
			}
			if !tc.other {
				got, _ := os.ReadFile(out)
				if !bytes.Equal(got, want) || res.Digest != refRes.Digest {
					t.Error("resumed output differs from an uninterrupted conversion")
				}
			}
			ents, _ := os.ReadDir(filepath.Dir(out))
			if len(ents) != 1 {
				var names []string
				for _, e := range ents {
					names = append(names, e.Name())
				}
				t.Errorf("finished output dir holds %v, want only m.gguf", names)
			}
		})
	}
}
