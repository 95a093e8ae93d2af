package local_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/lockfile"
	"github.com/ferry-llm/ferry/store"
	"github.com/ferry-llm/ferry/store/local"
	"github.com/ferry-llm/ferry/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) store.Backend {
			b, err := local.New(filepath.Join(t.TempDir(), "store"))
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		Damage: func(t *testing.T, b store.Backend, key string) {
			storetest.DamageFile(t, filepath.Join(b.(*local.Backend).Root(), filepath.FromSlash(key)))
		},
		Age: func(t *testing.T, b store.Backend, key string, d time.Duration) {
			storetest.AgeFile(t, filepath.Join(b.(*local.Backend).Root(), filepath.FromSlash(key)), d)
		},
		// A renewal slower than ttl/3 loses the lease: 1 s leaves room for
		// fsyncs on a loaded machine.
		LeaseTTL: time.Second,
	})
}

// Temp counts the files a put or a copy cut short left under .tmp, and
// removes the groups (a fetch's partial, journal and lock go together)
// older than asked that no live process holds.
func TestTemp(t *testing.T) {
	ctx := context.Background()
	b, err := local.New(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	tmp, err := b.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-3 * time.Hour)
	host, _ := os.Hostname()
	write := func(name string, size int, mtime time.Time) {
		t.Helper()
		p := filepath.Join(tmp, name)
		if err := os.WriteFile(p, make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	// A copy killed mid-fetch: partial, journal, and the lock of a
	// process that is gone (a pid no process has).
	write("copy-aaaa.partial", 1000, old)
	write("copy-aaaa.partial.journal", 10, old)
	dead, _ := json.Marshal(map[string]any{"pid": 1 << 30, "host": host, "started": old, "command": "store copy"})
	if err := os.WriteFile(filepath.Join(tmp, "copy-aaaa.partial.lock"), dead, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(filepath.Join(tmp, "copy-aaaa.partial.lock"), old, old)
	// A copy going on (its lock held here), stalled for hours.
	write("copy-bbbb.partial", 2000, old)
	held, err := lockfile.TryLock(filepath.Join(tmp, "copy-bbbb.partial.lock"), "fetch", "store copy")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock()
	os.Chtimes(filepath.Join(tmp, "copy-bbbb.partial.lock"), old, old)
	// A put killed a day ago; one three hours ago, maybe a PutFile still
	// hashing a big blob on another machine of a shared mount (kept a
	// day); one a minute old.
	write("put-123", 300, time.Now().Add(-25*time.Hour))
	write("put-789", 500, old)
	write("put-456", 400, time.Now().Add(-time.Minute))

	rep, err := b.Temp(ctx, time.Hour, false)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Files != 8 || rep.Removed != 6 {
		t.Errorf("count: %+v, want 8 files, 6 to remove", rep)
	}
	if n := len(entries(t, tmp)); n != 8 {
		t.Fatalf("counting removed files: %d left", n)
	}
	rep, err = b.Temp(ctx, time.Hour, true)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Removed != 4 || rep.RemovedBytes != 1000+10+int64(len(dead))+300 {
		t.Errorf("remove: %+v, want the dead copy's three files and the old put", rep)
	}
	if got, want := entries(t, tmp), []string{"copy-bbbb.partial", "copy-bbbb.partial.lock", "put-456", "put-789"}; !slices.Equal(got, want) {
		t.Errorf("left %v, want %v", got, want)
	}
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}
