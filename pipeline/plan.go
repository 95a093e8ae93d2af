package pipeline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ferry-llm/ferry/manifest"
)

// Planner is implemented by stages that can check, before anything runs,
// that Run will be able to make their outputs. Plan reads the inputs'
// headers and configs only (an inventory: no weight data), decides what
// Run would, and returns the error Run would end with (an unsupported
// architecture, a parameter the inputs do not allow). It writes nothing:
// env.WorkDir and env.Journal are not for planners. The runner calls it
// for `ferry pipeline plan`, in the planning pass that a run makes before
// it starts any stage, and once more just before the stage runs, when its
// Memory is what the run budgets for.
type Planner interface {
	Plan(ctx context.Context, env *Env) (*StagePlan, error)
}

// StagePlan is what a stage's planner found.
type StagePlan struct {
	// Summary is one line for plan output: what the stage will make.
	Summary string `json:"summary"`
	// Memory is the estimated peak memory of Run with env.Jobs workers,
	// in bytes: about workers × the largest unit held at once, plus a
	// constant.
	Memory int64 `json:"memory"`
	// OutputBytes is what the stage will write, where its planner knows
	// (0: it does not say). A run sharing its outputs gives the cores to
	// the stages that write the most first (Env.Cores).
	OutputBytes int64 `json:"output_bytes,omitempty"`
	// Preview, if not "", is a directory laid out like the stage's outputs
	// will be and readable now (an import's source directory): the stages
	// that read this one are planned from it before it has run.
	Preview string `json:"-"`
}

// defaultStageMemory is what a stage without a planner is budgeted for.
const defaultStageMemory = 64 << 20

// memoryOf is what the runner budgets for a stage with plan p.
func memoryOf(p *StagePlan) int64 {
	if p == nil || p.Memory <= 0 {
		return defaultStageMemory
	}
	return p.Memory
}

// planViews makes views of earlier stages' records in a temp directory,
// for planners to read: the views a run keeps may be out of date, and
// planning writes nothing into the store or the user's out: paths.
type planViews struct {
	store *manifest.Store
	dir   string
}

func (v *planViews) view(in Input) (Input, error) {
	if v.dir == "" {
		d, err := os.MkdirTemp("", "ferry-plan-")
		if err != nil {
			return Input{}, err
		}
		v.dir = d
	}
	dir := filepath.Join(v.dir, in.Stage)
	if err := v.store.MakeView(dir, in.Outputs); err != nil {
		return Input{}, err
	}
	in.Dir = dir
	return in, nil
}

func (v *planViews) close() {
	if v.dir != "" {
		os.RemoveAll(v.dir)
	}
}

// Plan says, per stage, whether a run would run it and why, and asks the
// planner of each stage that would run whether it can (see Planner). It
// reads the manifest, stats files and reads input headers; it reads no
// weight data and writes nothing. A stage its planner refuses is reported
// as invalid, and the error (every refusal, joined) is returned with the
// report.
func Plan(spec *Spec, opts Options) (*Report, error) {
	store, err := manifest.Load(spec.Store)
	if err != nil {
		return nil, err
	}
	r := newRunner(spec, store, opts)
	if r.shared, err = openSharedRead(context.Background(), spec); err != nil {
		return nil, err
	}
	sel, forced, err := r.selection()
	if err != nil {
		return nil, err
	}
	rep, err := r.plan(context.Background(), sel, forced)
	if rep != nil {
		r.eventMu.Lock()
		r.addWarnings(rep)
		r.eventMu.Unlock()
	}
	return rep, err
}

func (r *runner) plan(ctx context.Context, sel, forced map[string]bool) (*Report, error) {
	spec, store := r.spec, r.store
	views := &planViews{store: store}
	defer views.close()
	rep := r.report()
	state := map[string]StageReport{}
	inputs := map[string]*Input{}
	previews := map[string]string{}          // stage → Preview of its plan
	outsideMemo := map[string]outsideInput{} // stages outside the selection, as a run resolves them
	making := map[string]string{}            // those another machine is making: why
	var refused []error
	for _, st := range spec.Order() {
		sr := StageReport{Stage: st.Name, Kind: st.Kind, View: spec.ViewDir(st)}
		kind := spec.KindOf(st)
		var ins []Input
		var waiting, elsewhere []string
		blocked := ""
		for _, dep := range st.Deps {
			if in := inputs[dep.Name]; in != nil {
				ins = append(ins, *in)
				continue
			}
			switch ds := state[dep.Name]; ds.Action {
			case ActionRun, ActionPending:
				waiting = append(waiting, dep.Name)
			case ActionNotSelected:
				if w := making[dep.Name]; w != "" {
					elsewhere = append(elsewhere, w)
					break
				}
				blocked = fmt.Sprintf("input %s has no usable record (%s)", dep.Name, ds.Reason)
			default:
				blocked = fmt.Sprintf("input %s cannot be made (%s)", dep.Name, ds.Action)
			}
		}
		var runIns []Input // what the planner reads, when it can run now
		var work string    // the key its planner's env names (an import's work key)
		switch {
		case !sel[st.Name]:
			sr.Action = ActionNotSelected
			if in, err := r.existingInput(st); err == nil {
				inputs[st.Name] = &in
				sr.Reason = "not selected; has a complete record"
				sr.Key = in.Key
			} else if r.shared == nil {
				sr.Reason = err.Error()
			} else if o, serr := r.resolveOutside(ctx, st, outsideMemo); serr != nil {
				sr.Reason = serr.Error()
			} else if o.making != "" {
				sr.Reason = o.why
				making[st.Name] = o.why
			} else if o.in != nil {
				// As a run takes it: its record in the shared store.
				inputs[st.Name] = o.in
				sr.Reason = fmt.Sprintf("not selected; its record in %s (made on %s) is fetched by a run", r.spec.Shared, o.host)
				sr.Key, sr.Host = o.in.Key, o.host
			} else {
				sr.Reason = o.why
			}
		case !kind.Built():
			sr.Action = ActionNotBuilt
			sr.Reason = fmt.Sprintf("kind %q is not built yet (comes with %s)", st.Kind, kind.NotBuilt)
		case blocked != "":
			sr.Action, sr.Reason = ActionBlocked, blocked
		case len(elsewhere) > 0:
			// As a run does: it waits for that machine, then goes on.
			sr.Action, sr.Reason = ActionPending, strings.Join(elsewhere, "; ")+": a run waits for it, then plans this stage"
		case len(waiting) > 0:
			switch {
			case forced[st.Name]:
				sr.Action, sr.Reason, sr.Cause = ActionRun, "forced (after "+strings.Join(waiting, ", ")+")", CauseForced
			case store.StageRecord(spec.Name, st.Name) == nil:
				// Never run in this pipeline: it runs whatever its inputs
				// turn out to be.
				sr.Action, sr.Reason, sr.Cause = ActionRun, "new (after "+strings.Join(waiting, ", ")+")", CauseNew
			default:
				sr.Action = ActionPending
				sr.Reason = fmt.Sprintf("after %s: runs if the outputs it reads change", strings.Join(waiting, ", "))
			}
			if r.shared != nil && shareable(st) && !forced[st.Name] {
				// Its key is the digests of what it reads, not known yet.
				sr.Reason += "; fetched instead if " + r.spec.Shared + " has it made (its key is known once " + strings.Join(waiting, ", ") + " ran here)"
			}
			// Inputs not made yet can be planned from only where their
			// stage's plan shows what they will be (an import's source).
			var unseen []string
			for _, w := range waiting {
				if previews[w] == "" {
					unseen = append(unseen, w)
				}
			}
			if _, ok := st.Stage.(Planner); ok && len(unseen) > 0 {
				sr.Plan = "checked after " + strings.Join(unseen, ", ") + " runs"
				if n := len(unseen); n > 1 {
					sr.Plan = "checked after " + strings.Join(unseen[:n-1], ", ") + " and " + unseen[n-1] + " run"
				}
			}
			if len(unseen) > 0 {
				break
			}
			for _, dep := range st.Deps {
				in := inputs[dep.Name]
				if in == nil {
					in = &Input{Stage: dep.Name, Dir: previews[dep.Name]}
				}
				runIns = append(runIns, *in)
			}
		default:
			d, err := r.decide(st, ins, forced[st.Name])
			if err != nil {
				return nil, fmt.Errorf("stage %s: %w", st.Name, err)
			}
			sr.Action, sr.Reason, sr.Key, sr.Cause = d.action, d.reason, d.key, d.cause
			work = d.work
			if d.action == ActionRun && !forced[st.Name] && r.shared != nil && shareable(st) {
				in, host, err := r.planShared(ctx, st, d.key)
				if err != nil {
					return nil, fmt.Errorf("stage %s: %w", st.Name, err)
				}
				if in != nil {
					sr.Action, sr.Reason, sr.Cause, sr.Host = ActionFetch, madeOn(host, r.spec.Shared, 0), "", host
					sr.Reason = strings.Replace(sr.Reason, "; fetched from", "; a run fetches it from", 1)
					sr.Outputs = in.Outputs
					inputs[st.Name] = in
					break
				}
				if li, until, ok, err := r.shared.s.LeaseStatus(ctx, leaseName(d.key)); err == nil && ok {
					sr.Reason += fmt.Sprintf("; being made on %s (lease until %s): a run waits for it", li.Holder, until.Local().Format("15:04:05"))
					sr.Host = li.Holder
				}
			}
			if d.rec != nil {
				sr.Outputs = d.rec.Outputs
				in := r.recordInput(st, d.rec)
				inputs[st.Name] = &in
				break
			}
			runIns = ins
		}
		if runIns != nil || (sr.Action == ActionRun || sr.Action == ActionPending) && len(st.Deps) == 0 {
			p, err := r.planWithViews(ctx, views, st, work, runIns)
			switch {
			case err != nil:
				sr.Action, sr.Error = ActionInvalid, err.Error()
				refused = append(refused, fmt.Errorf("stage %s: %w", st.Name, err))
			case p != nil:
				sr.Plan = p.Summary
				previews[st.Name] = p.Preview
			}
		}
		state[st.Name] = sr
	}
	for _, st := range spec.Stages {
		rep.Stages = append(rep.Stages, state[st.Name])
	}
	return rep, errors.Join(refused...)
}

// planWithViews runs st's planner, if it has one (nil plan if not), over
// ins, reading recorded inputs through views made for the purpose (preview
// inputs are read where they are).
func (r *runner) planWithViews(ctx context.Context, views *planViews, st *StageSpec, key string, ins []Input) (*StagePlan, error) {
	pl, ok := st.Stage.(Planner)
	if !ok {
		return nil, nil
	}
	var vins []Input
	var fetched []string
	for _, in := range ins {
		if in.fetched {
			fetched = append(fetched, in.Stage)
		}
	}
	if len(fetched) > 0 {
		// Its inputs are in the shared store, not here yet: planned when
		// the run has fetched them.
		return &StagePlan{Summary: "checked after " + strings.Join(fetched, ", ") + " fetched"}, nil
	}
	for _, in := range ins {
		if in.Outputs != nil {
			v, err := views.view(in)
			if err != nil {
				return nil, err
			}
			in = v
		}
		vins = append(vins, in)
	}
	return pl.Plan(ctx, r.env(st, key, vins, nopProgress{}, false))
}
