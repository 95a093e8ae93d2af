package merge

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/internal/journal"
)

// JournalName is the resume journal in the output directory while a merge
// is unfinished (internal/journal's format, its ref the plan key): for each
// finished shard its sha256, size and stamp; for the shard being written
// (.NAME.partial) its last durable position and the sha256 state there.
// Execute removes it once the index is written.
const JournalName = ".ferry-merge.journal"

// mergeJournal is what the journal says about an output directory.
type mergeJournal struct {
	dir string
	// mu guards log, done and ckpt: shards are written at once, each
	// journaling from its own goroutine.
	mu   sync.Mutex
	log  *journal.Log
	done map[string]journal.Entry // finished shards by name
	ckpt map[string]journal.Entry // last checkpoint of unfinished shards
}

// openJournal loads the journal of an earlier run of the same plan, or
// starts one. A journal of another plan is an error: the directory holds
// another merge.
func openJournal(outDir, key string) (*mergeJournal, error) {
	p := filepath.Join(outDir, JournalName)
	ref, err := journal.Ref(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	case ref == "":
		return nil, inputErr(p, "", -1, ErrJournal, "unreadable journal; remove the output directory to start over")
	case ref != key:
		return nil, inputErr(p, "", -1, ErrJournal, "it was made for other inputs or options (plan key %.12s…, this plan %.12s…); choose another --out or remove it", ref, key)
	}
	log, entries, _, err := journal.Open(p, key)
	if err != nil {
		return nil, err
	}
	j := &mergeJournal{dir: outDir, log: log, done: map[string]journal.Entry{}, ckpt: map[string]journal.Entry{}}
	for _, e := range entries {
		switch {
		case e.Unit == "":
		case e.Commit != "":
			j.done[e.Unit] = e
			delete(j.ckpt, e.Unit)
		default:
			j.ckpt[e.Unit] = e
			delete(j.done, e.Unit) // being rewritten
		}
	}
	return j, nil
}

func partialPath(dir, name string) string {
	return filepath.Join(dir, "."+name+fsutil.PartialSuffix)
}

// removeStale deletes temp files the journal does not need: it keeps the
// partial file of each checkpointed shard, and of each committed shard a
// kill kept from its final name (finished renames it).
func (j *mergeJournal) removeStale() {
	stale, _ := filepath.Glob(filepath.Join(j.dir, ".*"+fsutil.PartialSuffix))
	keep := map[string]bool{}
	for name := range j.ckpt {
		keep[partialPath(j.dir, name)] = true
	}
	for name := range j.done {
		if _, err := os.Lstat(filepath.Join(j.dir, name)); errors.Is(err, fs.ErrNotExist) {
			keep[partialPath(j.dir, name)] = true
		}
	}
	for _, f := range stale {
		if !keep[f] {
			os.Remove(f)
		}
	}
}

// finished reports a shard an earlier run completed. Its stamp (size,
// mtime, inode) vouches for it; a file whose stamp changed is re-hashed,
// and kept (with its new stamp recorded) only if the digest still matches.
// A run killed between journaling the commit and renaming the partial file
// into place left the partial, with the committed stamp: the rename is
// finished here.
func (j *mergeJournal) finished(ctx context.Context, name string) (FileDigest, bool) {
	j.mu.Lock()
	e, ok := j.done[name]
	j.mu.Unlock()
	if !ok {
		return FileDigest{}, false
	}
	want := FileDigest{Name: name, Size: e.Size, SHA256: e.Commit}
	p := filepath.Join(j.dir, name)
	var rec fsutil.Stamp
	json.Unmarshal(e.Stamp, &rec)
	st, err := fsutil.StatStamp(p)
	if errors.Is(err, fs.ErrNotExist) {
		part := partialPath(j.dir, name)
		if pst, err := fsutil.StatStamp(part); err == nil && pst == rec {
			if os.Rename(part, p) == nil && fsutil.SyncDir(j.dir) == nil {
				return want, true
			}
		}
		return FileDigest{}, false
	}
	if err != nil {
		return FileDigest{}, false
	}
	if rec == st {
		return want, true
	}
	got, err := digestFile(ctx, p)
	if err != nil || got != want {
		return FileDigest{}, false
	}
	j.commit(want, st) // a failed append only costs a re-hash next time
	return want, true
}

func (j *mergeJournal) commit(d FileDigest, st fsutil.Stamp) error {
	raw, err := json.Marshal(st)
	if err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.log.Append(journal.Entry{Unit: d.Name, Commit: d.SHA256, Size: d.Size, Stamp: raw}); err != nil {
		return err
	}
	j.done[d.Name] = journal.Entry{Unit: d.Name, Commit: d.SHA256, Size: d.Size, Stamp: raw}
	delete(j.ckpt, d.Name)
	return nil
}

// dropCheckpoint forgets the checkpoint of shard name: it starts over.
func (j *mergeJournal) dropCheckpoint(name string) {
	j.mu.Lock()
	delete(j.ckpt, name)
	j.mu.Unlock()
}

func (j *mergeJournal) close() { j.log.Close() }

// remove deletes the journal of a finished merge.
func (j *mergeJournal) remove() error { return j.log.Remove() }

// shardOut is one shard being written: .NAME.partial, hashed as written,
// made durable and journaled (position + sha256 state) at the first write
// boundary after each checkpoint interval, and renamed into place by
// commit.
type shardOut struct {
	j     *mergeJournal
	name  string
	path  string
	f     *os.File
	bw    *bufio.Writer
	hw    *hashing.Writer
	every time.Duration
	last  time.Time
	err   error // sticky: after a failed write the position is unknown
	// inFile counts the bytes handed to the file (past the buffer):
	// what a reader of the partial file can read (Flushed).
	inFile atomic.Int64
}

// fileCounter counts what the buffer hands the file.
type fileCounter struct {
	f *os.File
	n *atomic.Int64
}

func (c fileCounter) Write(p []byte) (int, error) {
	n, err := c.f.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// Flushed is how many bytes of the shard are in its partial file: a
// reader of the file can read that far.
func (o *shardOut) Flushed() int64 { return o.inFile.Load() }

// openShard resumes the shard's partial file at its last checkpoint, or
// starts it afresh (no checkpoint, or one the file no longer backs).
func (j *mergeJournal) openShard(name string, every time.Duration) (*shardOut, error) {
	o := &shardOut{j: j, name: name, path: partialPath(j.dir, name), every: every, last: time.Now()}
	j.mu.Lock()
	ck, ok := j.ckpt[name]
	j.mu.Unlock()
	if ok {
		if f, err := os.OpenFile(o.path, os.O_RDWR, 0); err == nil {
			fi, err := f.Stat()
			if err == nil && fi.Size() >= ck.End && f.Truncate(ck.End) == nil {
				if _, err := f.Seek(ck.End, 0); err == nil {
					o.f = f
					o.inFile.Store(ck.End)
					o.bw = bufio.NewWriterSize(fileCounter{f, &o.inFile}, 1<<20)
					if hw, err := hashing.Resume(o.bw, ck.State, ck.End); err == nil {
						o.hw = hw
						return o, nil
					}
				}
			}
			f.Close()
		}
	}
	j.dropCheckpoint(name)
	f, err := os.OpenFile(o.path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: creating: %w", filepath.Join(j.dir, name), err)
	}
	o.f = f
	o.inFile.Store(0) // a resume tried above may have set it
	o.bw = bufio.NewWriterSize(fileCounter{f, &o.inFile}, 1<<20)
	o.hw = hashing.NewWriter(o.bw)
	return o, nil
}

// Written is the byte count of the shard so far.
func (o *shardOut) Written() int64 { return o.hw.Size() }

func (o *shardOut) Write(p []byte) (int, error) {
	if o.err != nil {
		return 0, o.err
	}
	n, err := o.hw.Write(p)
	if err != nil {
		o.err = fmt.Errorf("%s: %w", o.path, err)
		return n, o.err
	}
	if time.Since(o.last) >= o.every {
		if err := o.checkpoint(); err != nil {
			return n, err
		}
	}
	return n, nil
}

// checkpoint makes the bytes written so far durable, then journals their
// end and the hash state there.
func (o *shardOut) checkpoint() error {
	if o.err != nil {
		return o.err
	}
	if err := o.bw.Flush(); err != nil {
		o.err = fmt.Errorf("%s: %w", o.path, err)
		return o.err
	}
	if err := o.f.Sync(); err != nil {
		o.err = fmt.Errorf("%s: fsync: %w", o.path, err)
		return o.err
	}
	e := journal.Entry{Unit: o.name, End: o.hw.Size(), State: o.hw.State()}
	o.j.mu.Lock()
	err := o.j.log.Append(e)
	if err == nil {
		o.j.ckpt[o.name] = e
	}
	o.j.mu.Unlock()
	if err != nil {
		o.err = err
		return err
	}
	o.last = time.Now()
	return nil
}

// pause keeps the partial file for a resume: after an interruption the
// bytes written so far are checkpointed first (not after a failed write).
func (o *shardOut) pause() {
	o.checkpoint()
	o.f.Close()
}

// commit fsyncs the shard, journals its digest and stamp (seal), then
// renames it into place and fsyncs the directory.
func (o *shardOut) commit() (FileDigest, error) {
	d, err := o.seal()
	if err != nil {
		return FileDigest{}, err
	}
	if err := os.Rename(o.path, filepath.Join(o.j.dir, o.name)); err != nil {
		return FileDigest{}, err
	}
	return d, fsutil.SyncDir(o.j.dir)
}

// seal makes the partial file durable and journals its digest and stamp
// (a rename keeps both mtime and inode, so the stamp names the file under
// its final name too).
func (o *shardOut) seal() (FileDigest, error) {
	final := filepath.Join(o.j.dir, o.name)
	fail := func(err error) (FileDigest, error) {
		o.f.Close()
		return FileDigest{}, fmt.Errorf("%s: %w", final, err)
	}
	if o.err != nil {
		return fail(o.err)
	}
	if err := o.bw.Flush(); err != nil {
		return fail(err)
	}
	if err := o.f.Chmod(fsutil.DefaultPerm); err != nil {
		return fail(err)
	}
	if err := o.f.Sync(); err != nil {
		return fail(err)
	}
	if err := o.f.Close(); err != nil {
		return FileDigest{}, fmt.Errorf("%s: %w", final, err)
	}
	st, err := fsutil.StatStamp(o.path)
	if err != nil {
		return FileDigest{}, err
	}
	d := FileDigest{Name: o.name, Size: o.hw.Size(), SHA256: o.hw.Sum().Hex()}
	return d, o.j.commit(d, st)
}
