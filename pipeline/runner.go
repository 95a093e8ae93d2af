package pipeline

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ferry-llm/ferry/internal/cpushare"
	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/sysmem"
	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/store"
)

// Options select and tune a run or plan.
type Options struct {
	Force  []string // re-run these stages even if up to date
	Only   string   // run only this stage (its inputs must be complete)
	From   string   // re-run this stage and everything that depends on it
	Verify bool     // re-hash outputs instead of trusting their stamps
	// Version is ferry's release version ("dev" if empty), recorded in
	// the records a run makes as which release made them. It is not part
	// of any key: a kind's format version is (Kind.Version).
	Version string
	// Stages bounds the stages run at once (default: core count), and
	// Workers each stage's own worker count (default: core count).
	Stages, Workers int
	// Memory is the budget the stages running at once share, in bytes: a
	// stage starts only when its estimated peak (StagePlan.Memory) fits in
	// what the running ones leave; one bigger than the whole budget runs
	// alone. 0 means half of the machine's memory, < 0 no budget.
	Memory int64
	// LockWait is how long run waits for a store held by another run.
	LockWait time.Duration
	// Progress makes the progress reporter of a running stage; if it also
	// implements io.Closer it is closed when the stage ends.
	Progress func(stage string) Progress
	// ShareProgress makes the progress reporter of a stage's upload to the
	// shared store: from the first output the stage finishes while it
	// runs (stored early) to the last one stored after it (nil: a second
	// reporter of Progress's). Closed as Progress's are.
	ShareProgress func(stage string) Progress
	// Events, if set, receives the run's events (see Event) one at a
	// time, in the order they happen; it must not block for long. The
	// runner's own stage start, skip and done log lines are then at Debug
	// level: the events say the same.
	Events func(Event)
	Log    *slog.Logger
	// LeaseTTL is the ttl of the stage leases taken on a shared store
	// (0: the pipeline file's lease_ttl, else DefaultLeaseTTL).
	LeaseTTL time.Duration
	// CacheMax bounds this machine's cache of a shared store, in bytes
	// (0: the pipeline file's cache_max; none if that is 0 too): see
	// trimCache.
	CacheMax int64
	// Host names this machine in the shared store's leases and records
	// (default: the host name).
	Host string
	// SSH is how transfer stages reach their hosts, over what the
	// pipeline file says (ferry pipeline run's --ssh-config, --known-hosts
	// and -i).
	SSH SSHSettings
}

// Action is what a plan or a run does with a stage; it marshals as its
// string.
type Action string

// Actions a stage can get in a plan or a run.
const (
	ActionRun         Action = "run"          // will run / ran
	ActionSkip        Action = "skip"         // up to date
	ActionPending     Action = "pending"      // (plan) runs only if an input that re-runs first changes
	ActionNotBuilt    Action = "not-built"    // its kind is not built yet
	ActionBlocked     Action = "blocked"      // an input cannot be made
	ActionNotSelected Action = "not-selected" // outside --only / --from
	ActionFailed      Action = "failed"       // (run) it ran and failed
	ActionInterrupted Action = "interrupted"  // (run) it was running when the run was cancelled (Ctrl-C, SIGTERM); it resumes where it stopped
	ActionInvalid     Action = "invalid"      // (plan) its planner says it cannot run (Error says why)
	ActionFetch       Action = "fetch"        // (plan) another machine made it: a run fetches its outputs from the shared store
)

// StageReport is one stage's line in a plan or a run.
type StageReport struct {
	Stage  string `json:"stage"`
	Kind   string `json:"kind"`
	Action Action `json:"action"`
	Reason string `json:"reason"`
	// Cause is why the stage runs, in one word for scripts (see Cause);
	// "" when it does not run.
	Cause   Cause             `json:"cause,omitempty"`
	Key     string            `json:"key,omitempty"`
	View    string            `json:"view,omitempty"`
	Outputs []manifest.Output `json:"outputs,omitempty"`
	Seconds float64           `json:"seconds,omitempty"`
	Error   string            `json:"error,omitempty"`
	// Resumable is what an interrupted stage left for the next run to
	// continue from (journals, work dir), in bytes.
	Resumable int64 `json:"resumable_bytes,omitempty"`
	// Host is the machine that made the outputs of a stage fetched from
	// the shared store; Waited the seconds the run waited for its lease.
	Host   string  `json:"host,omitempty"`
	Waited float64 `json:"waited_seconds,omitempty"`
	// NotShared says why a stage made (or up to date) here is not in
	// the shared store: its upload or record failed, or the run was
	// interrupted while it uploaded. The next run shares it.
	NotShared string `json:"not_shared,omitempty"`
	// Plan is what the stage's planner says it will make, or, for a stage
	// whose inputs are not made yet, "checked after <stage> runs".
	Plan string `json:"plan,omitempty"`
	// Warnings are what the runner and the stage logged about it at Warn
	// level or above, in the order logged, as Report.Warnings.
	Warnings []string `json:"warnings,omitempty"`
}

// Report is the result of Plan or Run.
type Report struct {
	Pipeline string `json:"pipeline"`
	Store    string `json:"store"`
	// Cache is this machine's local store when Store is a shared one.
	Cache  string        `json:"cache,omitempty"`
	Vars   []Var         `json:"vars,omitempty"`
	Stages []StageReport `json:"stages"`
	// Warnings are what the run (or plan) logged at Warn level or above
	// about no stage, in the order logged, each as the warning event's
	// Reason: "message key=value …". A stage's are in its StageReport.
	Warnings []string `json:"warnings,omitempty"`
}

type decision struct {
	action Action
	reason string
	cause  Cause
	// key is the record key; "" for a source-keyed stage (import) that
	// runs: its key is known once it has read its files (execute).
	key string
	// work names the journals, work dir and attempt of a run: the key, or
	// for a source-keyed stage a key of its params with the path, local
	// to this machine (runner.key).
	work   string
	params json.RawMessage // canonical; a source-keyed stage's without the path
	ins    []manifest.Input
	rec    *manifest.Record // the matching complete record (skip)
}

type runner struct {
	spec  *Spec
	store *manifest.Store
	opts  Options
	log   *slog.Logger
	// shared is the store several machines share (nil: none); store is
	// then this machine's cache of it.
	shared *sharedStore
	// cores are the process's cores, handed to the stages that run side
	// by side by priority when the run shares its outputs (nil: not).
	cores *cpushare.Gate

	keyMu    sync.Mutex
	keyLocks map[string]*sync.Mutex

	// upMemo is what upToDate found, by stage.
	upMu   sync.Mutex
	upMemo map[string]upToDateResult

	// damaged holds the blobs this run found damaged (digest → which
	// output): each must be whole again when the run ends.
	damagedMu sync.Mutex
	damaged   map[manifest.Digest]string
	// removedShared: the stage keys whose damaged blob in the shared
	// store this run removed (told once, not again as a missing blob).
	removedShared sync.Map
	// pending marks the stages this run may make before it can key them
	// (markPending; nil: none).
	pending *pendingMarks

	// step is each selected stage's place in the run's order (1-based),
	// of steps; eventMu keeps events one at a time, and guards step and
	// steps (shares started before the run, behind it, send events),
	// warnings and ended.
	step    map[string]int
	steps   int
	eventMu sync.Mutex
	// warnings are the records at Warn or above logged through log, in
	// the order they came (see warnHandler); ended is set with the end
	// event, after which a warning is in the log only.
	warnings []warning
	ended    bool
}

// emit sends e to Options.Events, with its time and step.
func (r *runner) emit(e Event) {
	if r.opts.Events == nil {
		return
	}
	r.eventMu.Lock()
	defer r.eventMu.Unlock()
	r.send(e)
}

// send is emit, with eventMu held. Nothing the runner logs is logged
// under eventMu (a warning takes it), and Options.Events cannot log
// through the runner's logger: it never has it.
func (r *runner) send(e Event) {
	if r.ended {
		return // the end event is the last
	}
	e.Time = time.Now().UTC()
	if e.Stage != "" {
		e.Index = r.step[e.Stage]
	}
	e.Total = r.steps
	r.ended = e.Event == EventEnd
	r.opts.Events(e)
}

// warned keeps a warning the run logged for its report and sends it as
// an event (warnHandler calls it).
func (r *runner) warned(w warning) {
	r.eventMu.Lock()
	defer r.eventMu.Unlock()
	if r.ended {
		return
	}
	r.warnings = append(r.warnings, w)
	if r.opts.Events == nil {
		return
	}
	e := Event{Event: EventWarning, Stage: w.stage, Reason: w.text(), Attrs: w.attrMap()}
	if st := r.spec.Lookup(w.stage); st != nil {
		e.Kind = st.Kind
	}
	r.send(e)
}

// addWarnings puts the warnings logged so far into rep, in the order they
// came: a stage's in its StageReport, the others (and any of a stage rep
// does not list) in Report.Warnings. eventMu must be held.
func (r *runner) addWarnings(rep *Report) {
	at := map[string]int{}
	for i, sr := range rep.Stages {
		at[sr.Stage] = i
	}
	for _, w := range r.warnings {
		i, ok := at[w.stage]
		switch {
		case w.stage == "":
			rep.Warnings = append(rep.Warnings, w.text())
		case ok:
			rep.Stages[i].Warnings = append(rep.Stages[i].Warnings, w.text())
		default:
			rep.Warnings = append(rep.Warnings, "stage "+w.stage+": "+w.text())
		}
	}
}

// finish adds the run's warnings to rep and sends the end event, under
// one hold of eventMu: a warning is in both the report and the events,
// or (logged after the run ended) in neither.
func (r *runner) finish(rep *Report, end Event) {
	r.eventMu.Lock()
	defer r.eventMu.Unlock()
	r.addWarnings(rep)
	if r.opts.Events != nil {
		r.send(end)
	}
	r.ended = true
}

// lifecycle logs a stage's start, skip or end: at Info level, or at Debug
// when Options.Events receives the same as events (a display shows them).
func (r *runner) lifecycle(msg string, args ...any) {
	level := slog.LevelInfo
	if r.opts.Events != nil {
		level = slog.LevelDebug
	}
	r.log.Log(context.Background(), level, msg, args...)
}

// stepOf is "k/n" for stage name, for log lines.
func (r *runner) stepOf(name string) string {
	return fmt.Sprintf("%d/%d", r.step[name], r.steps)
}

// checkOutput is CheckBlob for output o of stage st; a blob found damaged
// is remembered for repaired.
func (r *runner) checkOutput(st *StageSpec, o manifest.Output) string {
	why := r.store.CheckBlob(o.Digest, o.Size, r.opts.Verify)
	if why == manifest.NoStamp {
		// A recorded output this machine never stamped (pulled by `ferry
		// store copy`): hashed once, stamped when whole.
		why = r.store.CheckBlob(o.Digest, o.Size, true)
	}
	if why != "" && r.store.Damage(o.Digest) != "" {
		r.damagedMu.Lock()
		if r.damaged == nil {
			r.damaged = map[manifest.Digest]string{}
		}
		r.damaged[o.Digest] = fmt.Sprintf("stage %s output %s", st.Name, o.Path)
		r.damagedMu.Unlock()
	}
	return why
}

// repaired says which damaged blobs this run found are still damaged: a
// re-run stage that made the same content replaced them; one that made
// other content (its inputs changed) or failed did not. A run must not
// end saying all is well over a blob that does not match its digest.
func (r *runner) repaired() error {
	var bad []string
	for d, where := range r.damaged {
		if why := r.store.Damage(d); why != "" {
			bad = append(bad, fmt.Sprintf("blob %s (%s): %s", d.Short(), where, why))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	return errkind.Errorf(errkind.VerifyFailed, "still damaged after this run: %s; 'ferry store verify' lists every damaged blob",
		strings.Join(bad, "; "))
}

// lockKey serialises the stages of one run that have the same key (same
// kind, parameters and inputs, e.g. one GGUF wanted in two out: views):
// they would share a journal and a work dir. The second one then finds the
// first one's record and skips.
func (r *runner) lockKey(key string) func() {
	r.keyMu.Lock()
	if r.keyLocks == nil {
		r.keyLocks = map[string]*sync.Mutex{}
	}
	m := r.keyLocks[key]
	if m == nil {
		m = &sync.Mutex{}
		r.keyLocks[key] = m
	}
	r.keyMu.Unlock()
	m.Lock()
	return m.Unlock
}

func newRunner(spec *Spec, store *manifest.Store, opts Options) *runner {
	l := opts.Log
	if l == nil {
		l = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Stages <= 0 {
		opts.Stages = runtime.NumCPU()
	}
	if opts.Workers <= 0 {
		opts.Workers = runtime.NumCPU()
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	if opts.Memory == 0 {
		opts.Memory = int64(min(sysmem.Total()/2, math.MaxInt64))
	}
	if opts.Memory <= 0 {
		opts.Memory = math.MaxInt64 // no budget (or the machine's memory is unknown)
	}
	r := &runner{spec: spec, store: store, opts: opts}
	// Its warnings, the stages' (Env.Log) included, are also events and
	// lines of the report.
	r.log = slog.New(newWarnHandler(l.Handler(), r.warned))
	return r
}

// selection returns the stages to consider and the stages to force.
func (r *runner) selection() (map[string]bool, map[string]bool, error) {
	sel := map[string]bool{}
	forced := map[string]bool{}
	for _, n := range r.opts.Force {
		if r.spec.Lookup(n) == nil {
			return nil, nil, errkind.Errorf(errkind.Usage, "--force %q: no such stage in %s", n, r.spec.File)
		}
		forced[n] = true
	}
	switch {
	case r.opts.Only != "" && r.opts.From != "":
		return nil, nil, errkind.Errorf(errkind.Usage, "--only and --from cannot be combined")
	case r.opts.Only != "":
		if r.spec.Lookup(r.opts.Only) == nil {
			return nil, nil, errkind.Errorf(errkind.Usage, "--only %q: no such stage in %s", r.opts.Only, r.spec.File)
		}
		sel[r.opts.Only] = true
	case r.opts.From != "":
		if r.spec.Lookup(r.opts.From) == nil {
			return nil, nil, errkind.Errorf(errkind.Usage, "--from %q: no such stage in %s", r.opts.From, r.spec.File)
		}
		for n := range r.spec.Dependents(r.opts.From) {
			sel[n] = true
			forced[n] = true
		}
	default:
		for _, st := range r.spec.Stages {
			sel[st.Name] = true
		}
	}
	return sel, forced, nil
}

// key is st's key over inputs (manifest.StageKey: kind, kind version,
// canonical params, input digests) with its canonical params. For a
// source-keyed stage (a Prober: import) it is the key of its params with
// the path: the work key that names its journals on this machine, not its
// record's key (manifest.SourceKey, known once it has run).
func (r *runner) key(st *StageSpec, inputs []Input) (string, json.RawMessage, []manifest.Input, error) {
	raw, err := json.Marshal(st.Stage.Params())
	if err != nil {
		return "", nil, nil, err
	}
	params, err := manifest.CanonicalJSON(raw)
	if err != nil {
		return "", nil, nil, err
	}
	var ins []manifest.Input
	var digests []manifest.Digest
	for _, in := range inputs {
		ins = append(ins, manifest.Input{Stage: in.Stage, Key: in.Key, Digest: in.Digest})
		digests = append(digests, in.Digest)
	}
	key, err := manifest.StageKey(st.Kind, r.spec.KindOf(st).Version, params, digests)
	if err != nil {
		return "", nil, nil, err
	}
	return key, params, ins, nil
}

// decide says whether st must run, given its inputs' outputs.
func (r *runner) decide(st *StageSpec, inputs []Input, forced bool) (decision, error) {
	return r.decideKeys(st, inputs, forced, true)
}

// decideKeys is decide; without outputs it does not look at the outputs
// of the record it finds (upToDate: a stage the run does not read, whose
// damage is not this run's to find, nor to hash under --verify).
func (r *runner) decideKeys(st *StageSpec, inputs []Input, forced, outputs bool) (decision, error) {
	key, params, ins, err := r.key(st, inputs)
	if err != nil {
		return decision{}, err
	}
	if p, ok := st.Stage.(Prober); ok {
		return r.decideSourced(st, p, key, params, forced, outputs)
	}
	d := decision{action: ActionRun, key: key, work: key, params: params, ins: ins}
	if forced {
		d.reason, d.cause = "forced", CauseForced
		return d, nil
	}
	rec := r.store.Record(key)
	if rec == nil {
		d.cause, d.reason = r.whyNoRecord(st, params, ins)
		if n := r.store.Resumable(key); n > 0 {
			d.reason += "; " + ResumableDetail(n) // what a killed run left
		}
		return d, nil
	}
	if _, ok := st.Stage.(remoteResults); ok && r.opts.Verify {
		d.reason, d.cause = "--verify: checking the copies on the remote hosts again", CauseRemote
		return d, nil
	}
	for _, o := range rec.Outputs {
		if !outputs {
			break
		}
		if why := r.checkOutput(st, o); why != "" {
			d.reason, d.cause = fmt.Sprintf("output %s %s", o.Path, why), CauseOutput
			return d, nil
		}
	}
	d.action, d.reason, d.cause, d.rec = ActionSkip, "up to date", "", rec
	return d, nil
}

func (r *runner) whyNoRecord(st *StageSpec, params json.RawMessage, ins []manifest.Input) (Cause, string) {
	prev := r.store.StageRecord(r.spec.Name, st.Name)
	if prev == nil {
		return CauseNew, "new"
	}
	if prev.Kind != st.Kind {
		return CauseKind, fmt.Sprintf("kind changed (%s -> %s)", prev.Kind, st.Kind)
	}
	if !jsonEqual(prev.Params, params) {
		return CauseParams, "parameters changed" + paramDiff(prev.Params, params)
	}
	var changed []string
	for i, in := range ins {
		if i >= len(prev.Inputs) || prev.Inputs[i].Digest != in.Digest {
			changed = append(changed, in.Stage)
		}
	}
	if len(changed) > 0 || len(prev.Inputs) != len(ins) {
		if len(changed) == 0 {
			return CauseInput, "inputs changed"
		}
		return CauseInput, "input changed: " + strings.Join(changed, ", ")
	}
	if v := r.spec.KindOf(st).Version; prev.KindVersion != v {
		return CauseVersion, fmt.Sprintf("kind %s format version changed (%s -> %s)", st.Kind, cmp.Or(prev.KindVersion, "none"), v)
	}
	return CauseNew, "no record for this key"
}

func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	ax, _ := json.Marshal(x)
	by, _ := json.Marshal(y)
	return string(ax) == string(by)
}

// recordInput turns a record into the Input a downstream stage sees.
func (r *runner) recordInput(st *StageSpec, rec *manifest.Record) Input {
	return Input{Stage: st.Name, Dir: r.spec.ViewDir(st), Outputs: rec.Outputs, Digest: rec.OutputsDigest(), Key: rec.Key}
}

// existingInput is a stage outside the selection that a selected stage
// reads: its record must be complete with outputs intact, and the one a
// run of the whole file would use now (upToDate): not one made before an
// adapter was retrained in place, say, or with other parameters.
func (r *runner) existingInput(st *StageSpec) (Input, error) {
	rec := r.store.StageRecord(r.spec.Name, st.Name)
	if rec == nil {
		return Input{}, fmt.Errorf("stage %s has not run yet; run it first (or drop --only/--from)", st.Name)
	}
	cur, why, err := r.upToDate(st)
	if err != nil {
		return Input{}, err
	}
	if why != "" {
		return Input{}, fmt.Errorf("stage %s is out of date (%s); run it first (or drop --only/--from)", st.Name, why)
	}
	if cur != nil {
		rec = cur
	}
	for _, o := range rec.Outputs {
		if why := r.checkOutput(st, o); why != "" {
			// The store is damaged (a blob vanished or changed), exit 3.
			return Input{}, errkind.Errorf(errkind.VerifyFailed, "stage %s: output %s %s; re-run it first", st.Name, o.Path, why)
		}
	}
	return r.recordInput(st, rec), nil
}

// upToDateResult is what upToDate found for a stage.
type upToDateResult struct {
	rec *manifest.Record
	why string
}

// upToDate is the record of st, outside the selection, that a run of the
// whole file would use now, found as that run decides: an import by its
// files' stamps (they are not read again), a stage after it by the key
// its inputs' records and this file's parameters give. why says what is
// not up to date, at st or before it. A nil record and "" mean it cannot
// be told here: an import whose files are not on this machine (another
// machine of a shared store read them), or a stage after one.
func (r *runner) upToDate(st *StageSpec) (*manifest.Record, string, error) {
	r.upMu.Lock()
	c, ok := r.upMemo[st.Name]
	r.upMu.Unlock()
	if ok {
		return c.rec, c.why, nil
	}
	var ins []Input
	for _, dep := range st.Deps {
		ds := r.spec.Lookup(dep.Name)
		rec, why, err := r.upToDate(ds)
		if err != nil || why != "" || rec == nil {
			return nil, why, err
		}
		ins = append(ins, r.recordInput(ds, rec))
	}
	if _, ok := st.Stage.(Prober); ok && !sourcesHere(st) {
		return nil, "", nil
	}
	d, err := r.decideKeys(st, ins, false, false)
	_, probes := st.Stage.(Prober)
	if err != nil && !probes {
		return nil, "", err
	}
	c = upToDateResult{rec: d.rec}
	switch {
	case err != nil:
		// Its sources cannot be looked at now (a bucket offline,
		// credentials expired): its record is taken as it stands, as
		// before --only looked at sources; remembered, so that the
		// warning is given once a run (the planning pass shares the memo).
		r.log.Warn("could not tell whether an import's sources changed: its record is used", "stage", st.Name, "err", err)
		c = upToDateResult{}
	case d.action == ActionSkip:
	case d.cause == CauseRemote:
		// Its record stands: a transfer's copies to check again
		// (--verify). Outputs are not looked at here (decideKeys): where
		// the run reads one damaged, existingInput says so (exit 3).
		c.rec = r.store.Record(d.key)
	default:
		c = upToDateResult{why: st.Name + ": " + d.reason}
		if _, ok := st.Stage.(Prober); ok && d.cause == CauseSource {
			c.why = st.Name + "'s files changed since it read them: " + d.reason
		}
	}
	r.upMu.Lock()
	if r.upMemo == nil {
		r.upMemo = map[string]upToDateResult{}
	}
	r.upMemo[st.Name] = c
	r.upMu.Unlock()
	return c.rec, c.why, nil
}

// Run executes the pipeline: first the planning pass Plan makes (a stage
// its planner refuses stops the run before anything starts), then the
// stages in dependency order, independent ones concurrently (see
// Options.Stages and Options.Memory), skipping stages whose key matches a
// complete record with intact outputs. Each finished stage is committed to
// the manifest at once, so a cancelled or killed run resumes from there.
func Run(ctx context.Context, spec *Spec, opts Options) (*Report, error) {
	r := newRunner(spec, nil, opts)
	sel, forced, err := r.selection()
	if err != nil {
		return nil, err
	}
	// Refuse before anything runs when a selected stage cannot.
	var notBuilt []string
	for _, st := range spec.Stages {
		if k := spec.KindOf(st); sel[st.Name] && !k.Built() {
			notBuilt = append(notBuilt, fmt.Sprintf("%s (%s: %s)", st.Name, st.Kind, k.NotBuilt))
		}
	}
	if len(notBuilt) > 0 {
		return nil, fmt.Errorf("stage kind is %w yet: %s; nothing was run (see 'ferry pipeline plan')", errkind.ErrNotBuilt, strings.Join(notBuilt, ", "))
	}
	store, err := manifest.Open(spec.Store)
	if err != nil {
		return nil, err
	}
	store.SetHost(r.opts.Host)
	r.store = store
	lock, err := store.LockWait(ctx, "ferry pipeline run "+spec.File, r.opts.LockWait)
	if err != nil {
		return nil, err
	}
	defer lock.Unlock()
	if lock.TookOver != nil {
		r.log.Warn("took over a stale store lock", "pid", lock.TookOver.PID, "host", lock.TookOver.Host, "since", lock.TookOver.Started)
	}
	if err := store.Reload(); err != nil {
		return nil, err
	}
	// A store of an older format (keys with ferry's version; every record
	// in manifest.json) was converted when read: written back once, now
	// that the lock is held.
	if err := store.SaveUpgrade(); err != nil {
		return nil, err
	}
	if err := store.ClearTemp(); err != nil {
		return nil, err
	}
	if spec.Shared != "" {
		r.cores = cpushare.New(runtime.GOMAXPROCS(0))
	}
	if r.shared, err = openShared(ctx, spec, r.opts, r.cores); err != nil {
		return nil, err
	}
	// The steps, before anything is logged or sent of a stage (a warning,
	// a wait for an input, the shares of earlier stages' "stage shared"
	// lines) that names one: stepOf, Event.Index and Total.
	r.eventMu.Lock()
	r.step = map[string]int{}
	for _, st := range spec.Order() {
		if sel[st.Name] {
			r.steps++
			r.step[st.Name] = r.steps
		}
	}
	r.eventMu.Unlock()
	// Inputs from outside the selection must exist before anything runs.
	outside := map[string]*Input{}
	memo := map[string]outsideInput{} // stages resolved by resolveOutside
	var toShare []func()
	for _, st := range spec.Stages {
		if !sel[st.Name] {
			continue
		}
		for _, dep := range st.Deps {
			if sel[dep.Name] || outside[dep.Name] != nil {
				continue
			}
			ds := spec.Lookup(dep.Name)
			in, err := r.existingInput(ds)
			if err == nil && r.shared != nil && shareable(ds) {
				// Made here, maybe by a run killed before it shared it:
				// shared once the run starts (behind it, under its stage
				// lease), or another machine would make it again.
				if rec := r.store.Record(in.Key); rec != nil {
					toShare = append(toShare, func() { r.publish(ctx, ds, rec, nil, nil) })
				}
			}
			if err != nil && r.shared != nil {
				// Made on another machine: its record in the shared store
				// (of the key this file gives it), fetched only when a
				// stage that reads it runs here (fetchInputs): one
				// fetched itself reads none. One being made there is
				// waited for.
				o, serr := r.waitOutside(ctx, ds, memo)
				if serr != nil {
					return nil, fmt.Errorf("stage %s needs %s: %w", st.Name, dep.Name, serr)
				}
				if o.in == nil {
					return nil, fmt.Errorf("stage %s needs %s: %s", st.Name, dep.Name, o.why)
				}
				r.log.Info("input in the shared store", "stage", dep.Name, "host", o.host, "outputs", len(o.in.Outputs))
				outside[dep.Name] = o.in
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("stage %s needs %s: %w", st.Name, dep.Name, err)
			}
			if err := store.MakeView(in.Dir, in.Outputs); err != nil {
				return nil, err
			}
			outside[dep.Name] = &in
		}
	}

	// The planning pass of `ferry pipeline plan` (without re-hashing:
	// stages are planned, not verified, here): a stage whose planner says
	// it cannot run stops the run before any stage starts.
	planOpts := r.opts
	planOpts.Verify = false
	pr := newRunner(spec, store, planOpts)
	pr.shared = r.shared
	pr.log = r.log // its warnings are the run's
	// What the inputs outside the selection were found to be, so that the
	// planning pass neither looks at them again nor warns twice.
	r.upMu.Lock()
	pr.upMemo = maps.Clone(r.upMemo)
	r.upMu.Unlock()
	prep, err := pr.plan(ctx, sel, forced)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, &InterruptedError{Err: cerr}
		}
		return nil, fmt.Errorf("%w; nothing was run (see 'ferry pipeline plan')", err)
	}
	if r.shared != nil {
		r.markPending(ctx, prep)
		defer r.pending.release(ctx)
	}
	for _, share := range toShare {
		share()
	}
	r.emit(Event{Event: EventStart})

	type slot struct {
		done chan struct{}
		in   *Input // nil if the stage did not complete
	}
	slots := map[string]*slot{}
	for _, st := range spec.Stages {
		slots[st.Name] = &slot{done: make(chan struct{})}
	}
	var mu sync.Mutex
	reports := map[string]StageReport{}
	stageErrs := map[string]error{}
	sched := newScheduler(r.opts.Stages, r.opts.Memory)
	// A failed stage blocks the stages that depend on it; independent
	// stages go on (their work is not thrown away). Cancelling ctx stops
	// everything.
	var wg sync.WaitGroup
	gctx := ctx
	for _, st := range spec.Order() {
		sl := slots[st.Name]
		if !sel[st.Name] {
			sl.in = outside[st.Name]
			close(sl.done)
			// Stages started above may be reporting already.
			mu.Lock()
			reports[st.Name] = StageReport{Stage: st.Name, Kind: st.Kind, Action: ActionNotSelected, Reason: "not selected"}
			mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := func() error {
				defer close(sl.done)
				var ins []Input
				for _, dep := range st.Deps {
					ds := slots[dep.Name]
					select {
					case <-ds.done:
					case <-gctx.Done():
						// Not to be made by this run: not marked so.
						r.pending.done(ctx, r, st.Name)
						return gctx.Err()
					}
					if ds.in == nil {
						r.pending.done(ctx, r, st.Name)
						why := "input " + dep.Name + " did not complete"
						mu.Lock()
						reports[st.Name] = StageReport{Stage: st.Name, Kind: st.Kind, Action: ActionBlocked, Reason: why}
						mu.Unlock()
						r.emit(Event{Event: EventBlocked, Stage: st.Name, Kind: st.Kind, Reason: why})
						return nil
					}
					ins = append(ins, *ds.in)
				}
				sr, in, err := r.runStage(gctx, st, ins, forced[st.Name], sched)
				mu.Lock()
				reports[st.Name] = sr
				mu.Unlock()
				if err != nil {
					return fmt.Errorf("stage %s: %w", st.Name, err)
				}
				sl.in = in
				return nil
			}()
			if err != nil {
				mu.Lock()
				stageErrs[st.Name] = err
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// Outputs still being shared behind the run: the run ends when every
	// stage it made is in the shared store (or says why not).
	if err := r.shared.wait(); err != nil {
		stageErrs[""] = err
	} else if ctx.Err() == nil && len(stageErrs) == 0 {
		// Only after a clean run: a failed stage may have adopted
		// outputs its record does not name yet.
		if err := r.trimCache(ctx); err != nil {
			stageErrs[""] = fmt.Errorf("trimming the cache %s: %w", spec.Store, err)
		}
	}
	rep := r.report()
	for _, st := range spec.Stages {
		sr, ok := reports[st.Name]
		if !ok {
			sr = StageReport{Stage: st.Name, Kind: st.Kind, Action: ActionBlocked, Reason: cancelledBeforeStart}
		}
		sr.NotShared = r.shared.notShared(st.Name)
		rep.Stages = append(rep.Stages, sr)
	}
	// The stages' errors in the file's order. A cancelled run ends in one
	// InterruptedError: a stage it stopped is not a failure.
	var errs []error
	for _, st := range spec.Stages {
		if e := stageErrs[st.Name]; e != nil && (ctx.Err() == nil || reports[st.Name].Action == ActionFailed) {
			errs = append(errs, e)
		}
	}
	if e := stageErrs[""]; e != nil && ctx.Err() == nil {
		errs = append(errs, e)
	}
	if cerr := ctx.Err(); cerr != nil {
		ie := &InterruptedError{Failed: errs, Err: cerr}
		for _, sr := range rep.Stages {
			if sr.Action == ActionInterrupted {
				ie.Running = append(ie.Running, InterruptedStage{Stage: sr.Stage, Resumable: sr.Resumable})
			}
			if r.shared.cutShort(sr.Stage) {
				ie.Sharing = append(ie.Sharing, sr.Stage)
			}
		}
		if len(ie.Sharing) > 0 {
			ie.SharedTo = r.spec.Shared
		}
		err = ie
	} else {
		if err := r.repaired(); err != nil {
			errs = append(errs, err)
		}
		err = errors.Join(errs...)
	}
	end := Event{Event: EventEnd, Report: rep}
	if err != nil {
		end.Error = err.Error()
	}
	r.finish(rep, end)
	return rep, err
}

// report is an empty report of the run's pipeline.
func (r *runner) report() *Report {
	rep := &Report{Pipeline: r.spec.Name, Store: r.spec.Store, Vars: r.spec.Vars}
	if r.spec.Shared != "" {
		rep.Store, rep.Cache = r.spec.Shared, r.spec.Store
	}
	return rep
}

// cancelledBeforeStart is the reason of a stage that a cancelled run
// stopped before the stage itself began.
const cancelledBeforeStart = "cancelled before it started"

// runStage runs or skips one stage and decides how it ended, for the
// report, the events and status: done; failed (with its error); or, when
// the run's context was cancelled (Ctrl-C, SIGTERM), interrupted if the
// stage itself had begun (its attempt is marked interrupted and keeps what
// it wrote, so status and the next run say what it left to resume), else
// cancelled before it started. Whatever error a cancelled stage returns
// (the context's, a file closed under it) is the interrupt, not a failure.
func (r *runner) runStage(ctx context.Context, st *StageSpec, ins []Input, forced bool, sched *scheduler) (StageReport, *Input, error) {
	sr, in, err := r.stage(ctx, st, ins, forced, sched)
	for tries := 0; err != nil && r.shared != nil && !forced && leaseLost(ctx, err) && tries < 3; tries++ {
		// Lost before the stage ran (while its inputs were fetched, while
		// it waited for memory: this machine paused past its ttl): the
		// stage is looked at again, as at the start: fetched if the
		// machine that took it made it, else made here under its lease.
		r.log.Warn("stage lease lost before the stage ran: looking at the stage again", "stage", st.Name, "err", err)
		sr, in, err = r.stage(ctx, st, ins, forced, sched)
	}
	switch {
	case err != nil && ctx.Err() != nil && sr.Action == ActionRun:
		sr.Action, sr.Error = ActionInterrupted, ""
		sr.Resumable = r.store.Resumable(sr.Key)
		r.emit(Event{Event: EventInterrupted, Stage: st.Name, Kind: st.Kind, Seconds: sr.Seconds, Reason: ResumableDetail(sr.Resumable)})
		if ierr := r.store.InterruptAttempt(r.spec.Name, st.Name, sr.Key); ierr != nil {
			r.log.Warn("could not record the interrupt in the manifest", "stage", st.Name, "err", ierr)
		}
	case err != nil && ctx.Err() != nil:
		sr.Action, sr.Reason, sr.Error = ActionBlocked, cancelledBeforeStart, ""
	case err != nil:
		sr.Action, sr.Error = ActionFailed, err.Error()
		r.emit(Event{Event: EventFailed, Stage: st.Name, Kind: st.Kind, Seconds: sr.Seconds, Error: sr.Error})
		if ferr := r.store.FailAttempt(r.spec.Name, st.Name, sr.Key, err.Error()); ferr != nil {
			r.log.Warn("could not record the failure in the manifest", "stage", st.Name, "err", ferr)
		}
	default:
		err = r.store.EndAttempt(r.spec.Name, st.Name)
	}
	return sr, in, err
}

// leaseLost says whether err, a stage's under a run whose context is
// ctx, is its lease's loss: the lease's error, or the cancellation of the
// stage's context by it while the run's goes on.
func leaseLost(ctx context.Context, err error) bool {
	return ctx.Err() == nil && (errors.Is(err, store.ErrLeaseLost) || errors.Is(err, context.Canceled))
}

func (r *runner) stage(ctx context.Context, st *StageSpec, ins []Input, forced bool, sched *scheduler) (StageReport, *Input, error) {
	// Decided, made or failed: no longer marked as one this run may make
	// (a stage it makes is marked under its own lease by then; one up to
	// date here that the shared store lacks, by its publish, once the
	// ref is pointed or its lease marked).
	published := false
	defer func() {
		if !published {
			r.pending.done(ctx, r, st.Name)
		}
	}()
	sr := StageReport{Stage: st.Name, Kind: st.Kind, View: r.spec.ViewDir(st)}
	key, _, _, err := r.key(st, ins) // an import's: its work key (see key)
	if err != nil {
		sr.Action, sr.Error = ActionFailed, err.Error()
		return sr, nil, err
	}
	defer r.lockKey(key)()
	d, err := r.decide(st, ins, forced)
	if err != nil {
		sr.Action, sr.Error = ActionFailed, err.Error()
		return sr, nil, err
	}
	// Until it has run, an import's report names its work key (what
	// runStage records an interrupt or a failure under); then its record's.
	sr.Key, sr.Reason, sr.Cause = cmp.Or(d.key, d.work), d.reason, d.cause
	var lease *store.Lease
	if r.shared != nil && shareable(st) {
		switch {
		case d.action == ActionSkip:
			// Up to date here: shared unless the shared store has it.
			r.publish(ctx, st, d.rec, nil, nil)
			published = true
		default:
			var rec *manifest.Record
			var host string
			// Forced, or --verify checking a transfer's copies on the
			// hosts again: run here, whatever the shared store holds.
			rerun := forced || d.cause == CauseRemote
			if !rerun {
				if rec, host, err = r.fromShared(ctx, st, d); err != nil {
					sr.Action, sr.Error = ActionFailed, err.Error()
					return sr, nil, err
				}
			}
			var waited time.Duration
			if rec == nil {
				lease, rec, host, waited, err = r.leaseStage(ctx, st, d, rerun)
				sr.Waited = waited.Seconds()
				if err != nil {
					sr.Action, sr.Error = ActionFailed, err.Error()
					return sr, nil, err
				}
			}
			if rec != nil {
				d.action, d.rec, d.cause, d.reason = ActionSkip, rec, "", madeOn(host, r.spec.Shared, waited)
				sr.Reason, sr.Cause, sr.Host = d.reason, "", host
				// The stage's ref names what this run uses, as a run that
				// finds the stage up to date here points it (a ref that
				// names another record, or none the store holds, is
				// pointed again).
				if err := r.setRef(ctx, st, rec.Key); errors.Is(err, errRecordPruned) {
					// Its outputs are here now: shared again, behind the run.
					r.publish(ctx, st, rec, nil, nil)
				} else if err != nil && ctx.Err() == nil {
					r.log.Warn("could not point the stage's ref in the shared store", "stage", st.Name, "err", err)
				}
			}
		}
	}
	runCtx := ctx
	if lease != nil {
		var done func()
		ctx, done = underLease(ctx, lease)
		defer done()
		// A stage that stops before it runs (its plan fails, the run is
		// cancelled while it waits for memory) gives its lease back, so
		// that other machines do not wait for it until this run ends.
		defer func() {
			if lease == nil {
				return // handed over below
			}
			if rerr := lease.Release(context.WithoutCancel(runCtx)); rerr != nil && lease.Err() == nil {
				r.log.Warn("could not release a stage lease (it expires after its ttl)", "stage", st.Name, "err", rerr)
			}
		}()
	}
	// A stage skipped: up to date here, or made on another machine.
	skip := func() (StageReport, *Input, error) {
		sr.Action, sr.Outputs, sr.Cause = ActionSkip, d.rec.Outputs, ""
		// Journals and the work dir left by a killed run of this key (or
		// one killed after its commit) are garbage now: the record is made,
		// here or on another machine.
		if err := r.store.RemoveIngest(d.work); err != nil {
			return sr, nil, err
		}
		if err := os.RemoveAll(r.store.WorkDir(d.work)); err != nil {
			return sr, nil, err
		}
		if err := r.store.Link(r.spec.Name, st.Name, d.key); err != nil {
			return sr, nil, err
		}
		if err := r.store.MakeView(sr.View, d.rec.Outputs); err != nil {
			return sr, nil, fmt.Errorf("view %s: %w", sr.View, err)
		}
		if sr.Host != "" {
			r.lifecycle("stage fetched", "stage", st.Name, "step", r.stepOf(st.Name), "key", d.key[:12], "why", d.reason)
		} else {
			r.lifecycle("stage up to date", "stage", st.Name, "step", r.stepOf(st.Name), "key", d.key[:12])
		}
		r.emit(Event{Event: EventSkip, Stage: st.Name, Kind: st.Kind, Reason: d.reason, View: sr.View, Outputs: sr.Outputs, Bytes: outputBytes(sr.Outputs)})
		in := r.recordInput(st, d.rec)
		return sr, &in, nil
	}
	if d.action == ActionSkip {
		return skip()
	}
	// It runs here: inputs still in the shared store only are fetched.
	if ins, err = r.fetchInputs(ctx, ins); err != nil {
		return sr, nil, err
	}
	// Planned again, as plan does, now that its inputs are made: what it
	// will need.
	views := &planViews{store: r.store}
	p, err := r.planWithViews(ctx, views, st, d.work, ins)
	views.close()
	if err != nil {
		return sr, nil, err
	}
	if p != nil {
		sr.Plan = p.Summary
	}
	release, err := sched.acquire(ctx, memoryOf(p))
	if err != nil {
		return sr, nil, err
	}
	held := true // the slot: given back while a lost lease is waited for
	defer func() {
		if held {
			release()
		}
	}()
	sr.Action = ActionRun
	r.lifecycle("stage start", "stage", st.Name, "step", r.stepOf(st.Name), "kind", st.Kind, "why", d.reason, "key", sr.Key[:12], "memory", FormatBytes(memoryOf(p)))
	r.emit(Event{Event: EventRun, Stage: st.Name, Kind: st.Kind, Reason: d.reason, Cause: d.cause, View: sr.View})
	if stageStarting != nil {
		stageStarting(st.Name)
	}
	start := time.Now()
	// Sharing its outputs, the run gives the cores to the stages that
	// write the most first.
	cores := r.cores.Share(outputBytesOf(p))
	// Under a lease, the outputs the stage finishes go to the shared store
	// as it runs; stopped before the lease is released (the deferred
	// release above runs after this), unless handed to publish.
	var early *earlyShare
	if lease != nil {
		early = r.earlyFor(runCtx, st.Name, lease)
	}
	defer func() { early.stop() }()
	rec, err := r.execute(ctx, st, d, ins, forced, cores, early)
	// Forced, or --verify checking a transfer's copies again: made here,
	// whatever another machine made meanwhile.
	rerun := forced || d.cause == CauseRemote
	for err != nil && lease != nil && lease.Err() != nil && runCtx.Err() == nil && !rerun {
		// The lease was lost while the stage ran (this machine paused
		// past its ttl, its link down): the machine that took it over may
		// have made the stage by now. Waited for as a lease held at the
		// start is, without the stage's memory: its record is fetched, or
		// the lease comes back here and the stage resumes from what this
		// run kept.
		r.log.Warn("stage lease lost while running: waiting for the machine that took it over", "stage", st.Name, "err", lease.Err())
		release()
		held = false
		nl, frec, host, waited, lerr := r.leaseStage(runCtx, st, d, false)
		sr.Waited += waited.Seconds()
		if lerr != nil {
			err = fmt.Errorf("%w (after its lease was lost: %v)", lerr, lease.Err())
			break
		}
		if frec != nil {
			lease = nil
			sr.Seconds = time.Since(start).Seconds()
			d.action, d.rec, d.cause, d.reason = ActionSkip, frec, "", madeOn(host, r.spec.Shared, waited)
			sr.Reason, sr.Host = d.reason+" (after this machine's lease was lost)", host
			return skip()
		}
		lease = nl
		var again func()
		ctx, again = underLease(runCtx, lease)
		defer again()
		early.stop()
		early = r.earlyFor(runCtx, st.Name, lease)
		if release, err = sched.acquire(ctx, memoryOf(p)); err != nil {
			break
		}
		held = true
		rec, err = r.execute(ctx, st, d, ins, forced, cores, early)
	}
	sr.Seconds = time.Since(start).Seconds()
	if err != nil {
		if lease != nil {
			if lerr := lease.Err(); lerr != nil && !forced {
				err = fmt.Errorf("%w (its work is kept: the next run resumes it)", lerr)
			} else if lerr != nil {
				err = fmt.Errorf("%w (a forced run starts again from nothing)", lerr)
			}
			// Released by the deferred call above, unless lost.
		}
		return sr, nil, err // runStage says whether it failed or was interrupted
	}
	if lease != nil {
		// Shared behind the run; the lease is released once the record
		// is in the shared store.
		r.publish(runCtx, st, rec, lease, early)
		lease, early = nil, nil
	}
	sr.Key, sr.Outputs = rec.Key, rec.Outputs
	if err := r.store.MakeView(sr.View, rec.Outputs); err != nil {
		// The record is committed (a re-run skips to making the view);
		// the stage still failed: its outputs are not where asked.
		return sr, nil, fmt.Errorf("view %s: %w", sr.View, err)
	}
	total := outputBytes(rec.Outputs)
	r.lifecycle("stage done", "stage", st.Name, "step", r.stepOf(st.Name), "outputs", len(rec.Outputs), "bytes", total, "seconds", fmt.Sprintf("%.3f", sr.Seconds))
	r.emit(Event{Event: EventDone, Stage: st.Name, Kind: st.Kind, View: sr.View, Outputs: rec.Outputs, Bytes: total, Seconds: sr.Seconds})
	in := r.recordInput(st, rec)
	return sr, &in, nil
}

// env is what stage st gets to run (or plan) with key over ins.
func (r *runner) env(st *StageSpec, key string, ins []Input, prog Progress, verify bool) *Env {
	return &Env{
		Pipeline: r.spec.Name, Stage: st.Name, Key: key, Dir: r.spec.Dir,
		Inputs: ins, store: r.store, Progress: prog, Log: r.log.With("stage", st.Name),
		Prev: r.store.StageRecord(r.spec.Name, st.Name), Verify: verify,
		Jobs: r.opts.Workers, SSH: r.opts.SSH, shared: r.shared != nil && shareable(st),
	}
}

// execute runs one stage and commits its record: blobs first (the stage
// made them durable), then the record (an object, or manifest.json for an
// import), then the journals go.
func (r *runner) execute(ctx context.Context, st *StageSpec, d decision, ins []Input, forced bool, cores *cpushare.Share, early *earlyShare) (*manifest.Record, error) {
	damaged := d.cause == CauseOutput
	if forced || damaged {
		// Start from scratch: a journal could hold the damaged bytes.
		if err := r.store.RemoveIngest(d.work); err != nil {
			return nil, err
		}
	}
	// The work dir of a killed run with this key is kept: stages that
	// write there (merge) resume from it.
	work := r.store.WorkDir(d.work)
	if forced || damaged {
		if err := os.RemoveAll(work); err != nil {
			return nil, err
		}
	}
	var prog Progress = nopProgress{}
	if r.opts.Progress != nil {
		prog = r.opts.Progress(st.Name)
	}
	if c, ok := prog.(io.Closer); ok {
		defer c.Close()
	}
	env := r.env(st, d.work, ins, prog, r.opts.Verify || forced || damaged)
	env.Cores = cores
	if early != nil {
		env.finished, env.ahead = early.add, early.addStream
	}
	if stageCores != nil {
		stageCores(st.Name, cores)
	}
	if err := r.store.BeginAttempt(r.spec.Name, st.Name, d.work); err != nil {
		return nil, err
	}
	started := time.Now().UTC()
	res, err := st.Stage.Run(ctx, env)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	outs := append([]manifest.Output(nil), res.Outputs...)
	sort.Slice(outs, func(i, j int) bool { return outs[i].Path < outs[j].Path })
	for i := 1; i < len(outs); i++ {
		if outs[i].Path == outs[i-1].Path {
			return nil, fmt.Errorf("stage produced %q twice", outs[i].Path)
		}
	}
	key := d.key
	if key == "" {
		// A source-keyed stage (import): keyed by what it read, so the
		// same files give the same key wherever they lie.
		if key, err = manifest.SourceKey(st.Kind, r.spec.KindOf(st).Version, d.params, manifest.OutputsDigest(outs)); err != nil {
			return nil, err
		}
	}
	rec := &manifest.Record{
		Key: key, Pipeline: r.spec.Name, Stage: st.Name, Kind: st.Kind,
		FerryVersion: r.opts.Version, KindVersion: r.spec.KindOf(st).Version,
		Params: d.params, Inputs: d.ins, Sources: res.Sources, Outputs: outs,
		Started: started, Finished: time.Now().UTC(),
	}
	if err := r.store.Commit(rec); err != nil {
		return nil, err
	}
	if err := r.store.RemoveIngest(d.work); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(work); err != nil {
		return nil, err
	}
	return rec, nil
}

// stageStarting, set by tests only, is called as a stage starts running.
var stageStarting func(stage string)

// stageCores, set by tests only, is told each stage's hold on the cores
// as it runs.
var stageCores func(stage string, c *cpushare.Share)

// outputBytesOf is what plan p says its stage will write (0: unknown).
func outputBytesOf(p *StagePlan) int64 {
	if p == nil {
		return 0
	}
	return p.OutputBytes
}
