package pipeline

import "github.com/ferry-llm/ferry/manifest"

// WithStore gives e the local store s, as the runner does, for tests that
// call a stage's Run themselves.
func WithStore(e *Env, s *manifest.Store) *Env {
	e.store = s
	return e
}

// BeforeShare makes f run before each stage is shared (nil: none).
func BeforeShare(f func(stage string)) { beforeShare = f }
