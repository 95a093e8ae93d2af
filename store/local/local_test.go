package local_test

import (
	"path/filepath"
	"testing"
	"time"

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
		// A renewal slower than ttl/3 loses the lease: 1 s leaves room for
		// fsyncs on a loaded machine.
		LeaseTTL: time.Second,
	})
}
