package convert

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/internal/journal"
	"github.com/ferry-llm/ferry/safetensors"
)

// RunOptions tune Run.
type RunOptions struct {
	// Jobs is the number of tensor workers (default: the core count).
	Jobs int
	// Progress receives checkpoint bytes consumed (resumed tensors
	// included), from any worker goroutine.
	Progress func(n int64)
	// Journal is the resume journal's path (default out + ".journal").
	Journal string
	// TensorDone, if set, is called (from worker goroutines) after tensor
	// i's bytes are written, before they are durable.
	TensorDone func(i int, name string)
	// Digest asks for the finished file's sha256 (RunResult.Digest),
	// hashed while it is written (WriteOptions.Digest).
	Digest bool
	// NonFinite is WriteOptions.NonFinite.
	NonFinite func(i int, name string, n int64)
}

// RunResult says what Run did. After a failure it says what is left to
// resume: Partial (out.partial, "" when nothing was left), the Journal and
// how many tensors it holds as Durable, and JournalErr if recording the
// last finished tensors failed (a resume then starts from the ones recorded
// before).
type RunResult struct {
	Resumed int            // tensors kept from an interrupted run
	Digest  hashing.Digest // sha256 of the finished file (RunOptions.Digest)
	Size    int64

	Partial    string
	Journal    string
	Durable    int
	JournalErr error
}

// Run owns a conversion's whole write lifecycle; `ferry gguf convert` and
// the pipeline's gguf stage both call it. The tensors go to out.partial
// (WriteOptions.Resume), and the internal/journal journal at
// RunOptions.Journal records, after each fsync of the partial file (about
// once a second), which tensors are durable; its ref is Stamp, so other
// inputs or options start over. Once out is renamed into place the journal
// is removed: a finished output leaves only the file. An interrupted or
// failed run leaves out.partial and the journal for a resume, or nothing
// when no partial file was made (a disk too full to reserve it).
func Run(ctx context.Context, ck *safetensors.Checkpoint, p *Plan, out string, o RunOptions) (*RunResult, error) {
	jpath := o.Journal
	if jpath == "" {
		jpath = out + ".journal"
	}
	j, err := openTensorJournal(jpath, out, Stamp(ck, p))
	if err != nil {
		return nil, err
	}
	res := &RunResult{Size: p.Layout.Size}
	var digest func([]byte)
	if o.Digest {
		digest = func(s []byte) { copy(res.Digest[:], s) }
	}
	err = Write(ctx, p, out, WriteOptions{
		Jobs: o.Jobs, Progress: o.Progress, Resume: true,
		Verify: func(i int, name string, _ *io.SectionReader) bool {
			if j.has(i, name) {
				res.Resumed++
				return true
			}
			return false
		},
		TensorDone: func(i int, name string) {
			j.done(i, name)
			if o.TensorDone != nil {
				o.TensorDone(i, name)
			}
		},
		Digest:    digest,
		NonFinite: o.NonFinite,
	})
	if err != nil {
		res.JournalErr = j.flush()
		j.close()
		res.Partial, res.Journal, res.Durable = gguf.PartialPath(out), jpath, j.durable()
		if _, serr := os.Stat(res.Partial); errors.Is(serr, fs.ErrNotExist) {
			// Nothing to resume: leave nothing.
			res.Partial, res.Journal, res.Durable = "", "", 0
			j.remove()
		}
		return res, err
	}
	if err := j.remove(); err != nil {
		return nil, err
	}
	return res, nil
}

// Stamp identifies a conversion: the planned header (every KV and tensor
// info, so the options too) and each input shard's path, size and
// modification time.
func Stamp(ck *safetensors.Checkpoint, p *Plan) string {
	h := sha256.New()
	h.Write(p.Layout.Header)
	for _, s := range ck.Shards {
		var mt int64
		if st, err := os.Stat(s.Path); err == nil {
			mt = st.ModTime().UnixNano()
		}
		fmt.Fprintf(h, "\x00%s\x00%d\x00%d", s.Path, s.Size, mt)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// tensorJournal records which tensors of out.partial are durable: tensors
// reported done stay pending until the partial file has been fsynced (at
// most once a second, and at flush), then are appended to the journal
// ("I NAME" units). Tensors are written out of file order by parallel
// workers, so a unit is a tensor, not a prefix with a hash state.
type tensorJournal struct {
	mu       sync.Mutex
	log      *journal.Log
	partial  string
	durableM map[string]bool
	pending  []string
	last     time.Time
	flushing bool // a background flush is running

	flushMu sync.Mutex     // one flush at a time
	bg      sync.WaitGroup // background flushes, waited for by close
}

func openTensorJournal(path, out, stamp string) (*tensorJournal, error) {
	log, entries, _, err := journal.Open(path, stamp)
	if err != nil {
		return nil, err
	}
	j := &tensorJournal{log: log, partial: gguf.PartialPath(out), durableM: map[string]bool{}, last: time.Now()}
	if _, err := os.Stat(j.partial); errors.Is(err, fs.ErrNotExist) {
		// Units of a partial file that is gone mean nothing.
		if len(entries) > 0 {
			if err := log.Reset(stamp); err != nil {
				log.Close()
				return nil, err
			}
		}
		return j, nil
	}
	for _, e := range entries {
		if e.Unit != "" {
			j.durableM[e.Unit] = true
		}
	}
	return j, nil
}

func unitName(i int, name string) string { return strconv.Itoa(i) + " " + name }

func (j *tensorJournal) has(i int, name string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.durableM[unitName(i, name)]
}

// done notes that tensor i is written, not yet durable. About once a
// second it starts a flush in the background, so the workers calling it
// never wait for the disk.
func (j *tensorJournal) done(i int, name string) {
	j.mu.Lock()
	j.pending = append(j.pending, unitName(i, name))
	due := !j.flushing && time.Since(j.last) > time.Second
	if due {
		j.flushing = true
		j.bg.Add(1)
	}
	j.mu.Unlock()
	if due {
		go func() {
			defer j.bg.Done()
			j.flush() // an error leaves the tensors pending for the next flush
			j.mu.Lock()
			j.flushing = false
			j.mu.Unlock()
		}()
	}
}

// flush fsyncs the partial file, then records the tensors reported done
// before it started.
func (j *tensorJournal) flush() error {
	j.flushMu.Lock()
	defer j.flushMu.Unlock()
	j.mu.Lock()
	units := j.pending
	j.pending = nil
	j.last = time.Now()
	j.mu.Unlock()
	if len(units) == 0 {
		return nil
	}
	err := j.record(units)
	j.mu.Lock()
	if err != nil {
		j.pending = append(units, j.pending...)
	} else {
		for _, u := range units {
			j.durableM[u] = true
		}
	}
	j.mu.Unlock()
	return err
}

func (j *tensorJournal) record(units []string) error {
	pf, err := os.Open(j.partial)
	if err != nil {
		return err
	}
	err = pf.Sync()
	pf.Close()
	if err != nil {
		return err
	}
	es := make([]journal.Entry, len(units))
	for k, u := range units {
		es[k] = journal.Entry{Unit: u}
	}
	return j.log.Append(es...)
}

// durable is how many tensors the journal holds as durable.
func (j *tensorJournal) durable() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.durableM)
}

// close waits for a background flush and keeps the journal.
func (j *tensorJournal) close() error {
	j.bg.Wait()
	return j.log.Close()
}

// remove waits for a background flush and deletes the journal.
func (j *tensorJournal) remove() error {
	j.bg.Wait()
	return j.log.Remove()
}
