package pipeline

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/ferry-llm/ferry/internal/cpushare"
	"github.com/ferry-llm/ferry/manifest"
)

// Stage is one configured step of a pipeline. A kind's constructor (see
// Kind) parses and validates the parameters into a Stage before anything
// runs; Run then does the work through the Env it is given.
//
// The stages a Stage reads are the ones its constructor asked for through
// Params.Ref / Params.Refs; they arrive, in that order, as Env.Inputs.
type Stage interface {
	// Params returns the stage's parameters: they are marshaled to JSON
	// and put in one canonical form (manifest.CanonicalJSON: keys sorted
	// at every level) in the stage key, so they must hold every setting
	// that changes the output and nothing that does not; field order does
	// not matter, nor an omitempty field at its zero value.
	Params() any
	// Run makes the stage's outputs. Each output is written into the store
	// through env (Ingest, Journal, or files made in env.WorkDir and
	// adopted) and returned in Result. Run must honour ctx; a cancelled or
	// failed run leaves no record, and whatever it journaled is resumed
	// next time.
	Run(ctx context.Context, env *Env) (*Result, error)
}

// Prober is implemented by stages that read files outside the store
// (import). Probe compares those files with what the record saw, by
// stamp only (no data read), and returns why the stage must re-run ("" if
// nothing changed). With a nil record it only says what is wrong with the
// sources ("" if nothing), for plan to report before a run.
type Prober interface {
	Probe(rec *manifest.Record) (string, error)
}

// Result is what a stage made.
type Result struct {
	Outputs []manifest.Output
	// Sources are files outside the store the stage read, with their
	// stamps at the time (so plan can tell when they change).
	Sources map[string]manifest.Stamp
}

// Input is an earlier stage's outputs as this stage sees them.
type Input struct {
	Stage string
	// Dir is the stage's view: a directory of symlinks into the store,
	// laid out like the stage's output tree (open it like any model dir).
	Dir     string
	Outputs []manifest.Output
	Digest  manifest.Digest // OutputsDigest of Outputs
	Key     string          // key of the record that made them
	// fetched: (plan) the outputs are in the shared store, not here yet.
	fetched bool
}

// Progress receives a running stage's byte counts.
type Progress interface {
	SetTotal(total int64)
	Add(n int64)
}

type nopProgress struct{}

func (nopProgress) SetTotal(int64) {}
func (nopProgress) Add(int64)      {}

// Env is what a running stage gets from the runner.
type Env struct {
	Pipeline string
	Stage    string
	Key      string // the stage key: names its journals and scratch space
	Dir      string // directory of the pipeline file
	Inputs   []Input
	// store is the local store (the pipeline's store, or this machine's
	// cache of a shared one). Stages reach it only through Env's methods:
	// they hand finished files over and see no store path, link or
	// backend; moving outputs between machines is the runner's.
	store    *manifest.Store
	Progress Progress
	// Log is the stage's logger (its records carry stage=NAME). What it
	// logs at Warn level or above is also a warning event of the run and
	// a line of the stage's report (see EventWarning).
	Log *slog.Logger
	// Prev is the latest earlier record of this pipeline stage (any key),
	// or nil: import uses it to skip re-hashing files whose stamps match.
	Prev *manifest.Record
	// Verify asks stages that reuse earlier results by stamp to re-hash.
	Verify bool
	// Jobs bounds the stage's own worker count.
	Jobs int
	// Cores, in a run that shares its outputs, is the stage's hold on the
	// process's cores, to take for each unit of its work (nil otherwise:
	// take none). Stages that write more bytes hold a higher priority: their
	// uploads, the run's tail, start while the others still compute.
	Cores *cpushare.Share
	// SSH is how the run was told to reach hosts (ferry pipeline run's
	// --ssh-config, --known-hosts, -i); it takes precedence over a
	// stage's own settings.
	SSH SSHSettings
	// finished, in a run that shares the stage's outputs, is told of each
	// blob AdoptFile, AdoptKnown or Ingest made: it goes to the shared
	// store while the stage goes on (nil: nothing shared early). A stage
	// that hands its outputs over as it finishes them, not all at its end,
	// has them shared sooner.
	finished func(d manifest.Digest, size int64)
	// ahead, with finished, stores a blob a stage is still writing, whose
	// digest it knows ahead of its bytes (ShareAhead).
	ahead func(d manifest.Digest, size int64, src io.ReaderAt) bool
	// shared: the run shares the stage's outputs (Shared).
	shared bool
}

// ShareAhead, in a run that shares the stage's outputs early, stores the
// blob d of size bytes while the stage still writes it: src reads it,
// each ReadAt waiting until the bytes it asks for are written (or
// failing once the stage stops). The digest is known ahead of the bytes
// (computed by a pass of the stage's own, merge.Digests): the store
// hashes what it reads and keeps the blob only if it is d, so bytes that
// differ cost the upload, not the blob. The file's own hand-over
// (AdoptKnown) stores nothing again. It reports whether an upload took
// src, which then closes it (an io.Closer) when done; elsewhere, or for a
// blob too small or already going up, it does nothing.
func (e *Env) ShareAhead(d manifest.Digest, size int64, src io.ReaderAt) bool {
	return e.ahead != nil && e.ahead(d, size, src)
}

// Shared says whether the run shares the stage's outputs in a shared
// store (in Plan too, before any hand-over is set up): a stage's plan
// counts the memory of what it does only then.
func (e *Env) Shared() bool { return e.shared }

// SharesEarly says whether the blobs the stage adopts go to the shared
// store as it hands them over (a stage that finishes files one by one
// then hands each over when it is whole, not all at its end).
func (e *Env) SharesEarly() bool { return e.finished != nil }

// made tells finished of a blob a stage made.
func (e *Env) made(d manifest.Digest, n int64, err error) (manifest.Digest, int64, error) {
	if err == nil && e.finished != nil {
		e.finished(d, n)
	}
	return d, n, err
}

// Input returns the input from stage name, or nil.
func (e *Env) Input(name string) *Input {
	for i := range e.Inputs {
		if e.Inputs[i].Stage == name {
			return &e.Inputs[i]
		}
	}
	return nil
}

// Journal opens (or resumes) a journaled big output at relative path rel.
func (e *Env) Journal(rel string) (*manifest.Journal, error) {
	return e.store.OpenJournal(e.Key, rel)
}

// AdoptFile makes the finished file p (made in WorkDir) an output blob: it
// is hashed, then kept without a copy (a hard link) where it can be.
func (e *Env) AdoptFile(p string) (manifest.Digest, int64, error) { return e.made(e.store.Adopt(p)) }

// AdoptKnown is AdoptFile for a file whose digest and size its writer
// computed while writing it.
func (e *Env) AdoptKnown(p string, d manifest.Digest, size int64) (manifest.Digest, int64, error) {
	return e.made(e.store.AdoptKnown(p, d, size))
}

// Ingest stores the size bytes r yields as an output blob.
func (e *Env) Ingest(r io.Reader, size int64) (manifest.Digest, int64, error) {
	return e.made(e.store.Ingest(r, size))
}

// ViewOf lays out an input's outputs under dir (inside WorkDir) as the
// directory tree they came from, for readers that open a model directory
// by another name than the input's own Dir.
func (e *Env) ViewOf(in *Input, dir string) error { return e.store.MakeView(dir, in.Outputs) }

// StateDir is a directory of this machine's, named name, that outlives runs
// and keys (the transfer stage's index of what each host holds).
func (e *Env) StateDir(name string) (string, error) {
	d := filepath.Join(e.store.Root, name)
	return d, os.MkdirAll(d, 0o755)
}

// Local is the local store itself, for import, the one stage that is this
// machine's by nature: it reads files where they lie (in-place blobs,
// their stamps, resumable hashing) and is never shared.
func (e *Env) Local() *manifest.Store { return e.store }

// WorkDir returns the stage's scratch directory inside the store (same file
// system as the blobs, so finished files are adopted without copying). It
// is keyed by the stage key and kept across killed runs, so a stage can
// resume there; the runner empties it before a forced run and removes it
// after a commit.
func (e *Env) WorkDir() (string, error) {
	d := e.store.WorkDir(e.Key)
	return d, os.MkdirAll(d, 0o755)
}

// Kind describes a stage kind in the registry.
type Kind struct {
	// New parses params into a Stage. Nil means the kind is not built yet.
	New func(p *Params) (Stage, error)
	// Version is the kind's output-format version, part of every key of
	// its stages (ferry's release is not): bump it when the kind's output
	// bytes change for the same inputs and parameters, so records made
	// before are not taken for the new bytes. TestKindOutputsPinned fails
	// when they change and it does not.
	Version string
	// NotBuilt says where the kind will come from while New is nil.
	NotBuilt string
	// RefKeys are the parameters of a not-built kind that name stages, so
	// the graph can still be checked.
	RefKeys []string
	// Summary is one line for help and plan output.
	Summary string
}

// Built reports whether the kind can run.
func (k Kind) Built() bool { return k.New != nil }
