// Package pipelinetest holds what tests and benchmarks of pipelines use
// and ferry does not ship: the synth stage kind, and the set of kinds
// that adds it to the built-in ones. Tests parse pipeline files with
// pipeline.WithKinds(pipelinetest.Kinds()); the ferry binary the CLI tests
// run is built with -tags ferry_synth, which makes cmd/ferry do the same.
package pipelinetest

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/pipeline"
)

// Kinds returns ferry's built-in stage kinds plus synth.
func Kinds() *pipeline.Kinds { return pipeline.BuiltinKinds().With("synth", Synth()) }

// Synth returns the synth stage kind.
func Synth() pipeline.Kind {
	return pipeline.Kind{New: newSynth, Version: "1",
		Summary: "test/benchmark stage: deterministic pseudo-random bytes written in journaled units"}
}

// synthStage is a test and benchmark stage: it writes one file of
// deterministic pseudo-random bytes in journaled units, so the kill test and
// the benchmarks can exercise resumable big outputs without model data.
//
//	synth: { size: 100MB, units: 50, seed: 1, from: other, file: data.bin, memory: 1GB, fail: "", fail_plan: "", pace: 100ms }
//
// Unit i holds bytes from a ChaCha8 stream seeded by sha256 of (seed, i,
// the digests of the from stages), so any unit can be made without the
// ones before it, and a resumed run writes exactly the bytes an
// uninterrupted one would. With --verbose every unit logs "synth unit
// begin" before its first byte and "synth unit done" once it is durable in
// the journal.
//
// memory is the peak memory its planner declares (default: its 1 MiB
// buffer), so tests can check that a run keeps within its budget; fail
// makes Run fail with that message before it writes anything, so tests can
// make a stage fail without changing its key, and fail_plan makes its
// planner fail (once its inputs are here: a plan of fetched inputs waits
// for the run); pace makes each unit take at least that long, so tests
// can act on a stage while it runs. None changes the output; none is part
// of the stage key.
type synthStage struct {
	Size     int64         `json:"size"`
	Units    int64         `json:"units"`
	Seed     int64         `json:"seed"`
	File     string        `json:"file"`
	From     []string      `json:"from,omitempty"`
	Memory   int64         `json:"-"`
	Fail     string        `json:"-"`
	FailPlan string        `json:"-"`
	Pace     time.Duration `json:"-"`
}

var (
	_ pipeline.Stage   = (*synthStage)(nil)
	_ pipeline.Planner = (*synthStage)(nil)
)

const synthBuffer = 1 << 20

const maxSynthUnits = 1 << 20

func newSynth(p *pipeline.Params) (pipeline.Stage, error) {
	s := &synthStage{}
	var err error
	if s.Size, err = p.Size("size", 0); err != nil {
		return nil, err
	}
	if s.Size <= 0 {
		return nil, p.Errorf("size", "must be given and positive")
	}
	if s.Units, err = p.Int("units", 1); err != nil {
		return nil, err
	}
	if s.Units < 1 || s.Units > maxSynthUnits || s.Units > s.Size {
		return nil, p.Errorf("units", "must be between 1 and min(size, %d)", maxSynthUnits)
	}
	if s.Seed, err = p.Int("seed", 0); err != nil {
		return nil, err
	}
	if s.File, err = p.String("file", false); err != nil {
		return nil, err
	}
	if s.File == "" {
		s.File = "synth.bin"
	}
	if s.From, err = p.Refs("from", false); err != nil {
		return nil, err
	}
	if s.Memory, err = p.Size("memory", synthBuffer); err != nil {
		return nil, err
	}
	if s.Fail, err = p.String("fail", false); err != nil {
		return nil, err
	}
	if s.FailPlan, err = p.String("fail_plan", false); err != nil {
		return nil, err
	}
	pace, err := p.String("pace", false)
	if err != nil {
		return nil, err
	}
	if pace != "" {
		if s.Pace, err = time.ParseDuration(pace); err != nil || s.Pace < 0 {
			return nil, p.Errorf("pace", "want a duration such as 100ms")
		}
	}
	return s, nil
}

// Plan checks that every from stage is given and declares Memory.
func (s *synthStage) Plan(ctx context.Context, env *pipeline.Env) (*pipeline.StagePlan, error) {
	for _, f := range s.From {
		if env.Input(f) == nil {
			return nil, fmt.Errorf("synth: input %q not given", f)
		}
	}
	if s.FailPlan != "" {
		return nil, errors.New(s.FailPlan)
	}
	return &pipeline.StagePlan{Summary: fmt.Sprintf("%d bytes in %d units", s.Size, s.Units), Memory: s.Memory}, nil
}

func (s *synthStage) Params() any { return s }

func (s *synthStage) unitSize(i int64) int64 {
	per := s.Size / s.Units
	if i == s.Units-1 {
		return s.Size - per*(s.Units-1)
	}
	return per
}

func (s *synthStage) Run(ctx context.Context, env *pipeline.Env) (*pipeline.Result, error) {
	if s.Fail != "" {
		return nil, errors.New(s.Fail)
	}
	j, err := env.Journal(s.File)
	if err != nil {
		return nil, err
	}
	defer j.Close()
	env.Progress.SetTotal(s.Size)
	if o, ok := j.Committed(); ok {
		env.Progress.Add(o.Size)
		return &pipeline.Result{Outputs: []manifest.Output{o}}, nil
	}
	done := j.Units()
	for i, u := range done {
		if u.Name != unitName(int64(i)) {
			return nil, fmt.Errorf("synth %s: journal unit %d is %q, want %q", env.Stage, i, u.Name, unitName(int64(i)))
		}
	}
	env.Progress.Add(j.Offset())
	h := sha256.New()
	binary.Write(h, binary.LittleEndian, s.Seed)
	for _, in := range env.Inputs {
		h.Write([]byte(in.Digest))
	}
	base := h.Sum(nil)
	buf := make([]byte, synthBuffer)
	for i := int64(len(done)); i < s.Units; i++ {
		env.Log.Debug("synth unit begin", "unit", i)
		if s.Pace > 0 {
			select {
			case <-time.After(s.Pace):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		var seed [32]byte
		uh := sha256.New()
		uh.Write(base)
		binary.Write(uh, binary.LittleEndian, i)
		copy(seed[:], uh.Sum(nil))
		rng := rand.NewChaCha8(seed)
		for left := s.unitSize(i); left > 0; {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			b := buf[:min(int64(len(buf)), left)]
			rng.Read(b)
			if _, err := j.Write(b); err != nil {
				return nil, err
			}
			left -= int64(len(b))
			env.Progress.Add(int64(len(b)))
		}
		if err := j.EndUnit(unitName(i)); err != nil {
			return nil, err
		}
		env.Log.Debug("synth unit done", "unit", i)
	}
	o, err := j.Commit(s.Size)
	if err != nil {
		return nil, err
	}
	return &pipeline.Result{Outputs: []manifest.Output{o}}, nil
}

func unitName(i int64) string { return fmt.Sprintf("unit-%d", i) }
