package pipeline

import (
	"github.com/ferry-llm/ferry/internal/cpushare"
	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/store"
)

// WithStore gives e the local store s, as the runner does, for tests that
// call a stage's Run themselves.
func WithStore(e *Env, s *manifest.Store) *Env {
	e.store = s
	return e
}

// WrapShared makes f wrap the storage of each run's shared store (nil:
// none).
func WrapShared(f func(store.Backend) store.Backend) { wrapShared = f }

// BeforeShare makes f run before each stage is shared (nil: none).
func BeforeShare(f func(stage string)) { beforeShare = f }

// StageCores makes f told each stage's priority on the cores as it runs
// (ok false: it takes no cores; nil f: none told).
func StageCores(f func(stage string, prio int64, ok bool)) {
	if f == nil {
		stageCores = nil
		return
	}
	stageCores = func(stage string, c *cpushare.Share) { f(stage, c.Priority(), c != nil) }
}

// MergeShardDone makes f told of each shard a merge stage made a blob of,
// while it writes the others (nil: none).
func MergeShardDone(f func(name string)) { mergeShardDone = f }

// EarlyStored makes f told of each output blob stored in the shared store
// while its stage ran (nil: none).
func EarlyStored(f func(d manifest.Digest)) { earlyStored = f }

// SharePut makes f told of each output blob a stage's share stores (or
// finds stored) itself, not early (nil: none).
func SharePut(f func(d manifest.Digest)) { sharePut = f }

// EarlyMin sets the smallest blob stored early and returns the one before.
func EarlyMin(n int64) int64 {
	old := earlyMin
	earlyMin = n
	return old
}

// StageStarting makes f called as each stage starts running (nil: none).
func StageStarting(f func(stage string)) { stageStarting = f }

// MLXShardDone makes f told of each shard the MLX stage hands over while
// it converts (nil: none).
func MLXShardDone(f func(name string)) { mlxShardDone = f }

// MergeAhead makes started told of each merge shard stored ahead of its
// bytes, and whole of each shard whole before the merge hands it over
// (nil: none).
func MergeAhead(started, whole func(name string)) {
	mergeAheadStarted, mergeShardWhole = started, whole
}

// MergeNoAhead turns a shared merge's pass ahead off (true) or on; it
// returns the setting before.
func MergeNoAhead(off bool) bool {
	old := mergeNoAhead
	mergeNoAhead = off
	return old
}

// EarlyFailed makes f told of each early upload that failed, once it is
// over (nil: none).
func EarlyFailed(f func(d manifest.Digest)) { earlyFailed = f }
