package s3_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/s3test"
	"github.com/ferry-llm/ferry/store"
	s3store "github.com/ferry-llm/ferry/store/s3"
	"github.com/ferry-llm/ferry/store/storetest"
)

// The conformance suite against a real versitygw, each test in a prefix
// of its own.
func TestConformance(t *testing.T) {
	srv := s3test.Start(t, "ferry-store")
	srv.Env(t)
	var n atomic.Int64
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) store.Backend {
			b, err := s3store.Open(context.Background(), fmt.Sprintf("s3://ferry-store/t%d/store", n.Add(1)))
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		Damage: func(t *testing.T, b store.Backend, key string) {
			sb := b.(*s3store.Backend)
			storetest.DamageFile(t, srv.ObjectPath(sb.Bucket(), sb.ObjectKey(key)))
		},
		// Dates have whole seconds.
		LeaseTTL: 2 * time.Second,
	})
}
