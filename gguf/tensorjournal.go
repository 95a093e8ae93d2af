package gguf

import (
	"errors"
	"io/fs"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/journal"
)

// TensorJournal is the resume journal (internal/journal) of a GGUF file
// written by tensor: gguf convert's and quantize's. It records which
// tensors of out.partial are durable: tensors
// reported done stay pending until the partial file has been fsynced (at
// most once a second, and at flush), then are appended to the journal
// ("I NAME" units). Tensors are written out of file order by parallel
// workers, so a unit is a tensor, not a prefix with a hash state.
type TensorJournal struct {
	// Every is how often Done starts a flush (default a second): an fsync
	// of a large partial file costs, and a resume redoes at most this
	// much work. Set it before the first Done.
	Every time.Duration

	mu       sync.Mutex
	path     string
	log      *journal.Log
	partials []string // the partial files, the first part's first
	noSync   bool     // see OpenTensorJournal
	durableM map[string]bool
	pending  []string
	last     time.Time
	flushing bool // a background flush is running

	flushMu sync.Mutex     // one flush at a time
	bg      sync.WaitGroup // background flushes, waited for by close
}

// OpenTensorJournal opens (or starts) the journal at path for the file out,
// written as PartialPath(out); stamp identifies the write (its plan and
// inputs), and a journal of another stamp, or of a partial file that is
// gone, starts over.
//
// noSync is for a writer with Options.NoSync: the journal then fsyncs
// neither the partial file nor itself, so a tensor it records is in the
// page cache, not necessarily on the disk. That survives a kill, not a
// power loss or a crash of the system, so its stamp also names the boot
// (fsutil.BootID): after a reboot the journal is not trusted and the file
// starts over, and a journal of a synced run is not resumed by an
// unsynced one or the other way round.
func OpenTensorJournal(path, out, stamp string, noSync bool) (*TensorJournal, error) {
	return OpenTensorJournalFiles(path, []string{out}, stamp, noSync)
}

// OpenTensorJournalFiles is OpenTensorJournal for a write of several
// files, the parts of a split (Layout.Files): it fsyncs all of them
// before it records tensors, and their partial files are gone only when
// none is left.
func OpenTensorJournalFiles(path string, outs []string, stamp string, noSync bool) (*TensorJournal, error) {
	if noSync {
		stamp += "\x00no-sync\x00" + fsutil.BootID()
	}
	log, entries, _, err := journal.Open(path, stamp)
	if err != nil {
		return nil, err
	}
	j := &TensorJournal{Every: time.Second, path: path, log: log, durableM: map[string]bool{}, last: time.Now(), noSync: noSync}
	for _, out := range outs {
		j.partials = append(j.partials, PartialPath(out))
	}
	if !j.partialLeft() {
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

// Has reports whether tensor i (named name) is durable in the partial file.
func (j *TensorJournal) Has(i int, name string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.durableM[unitName(i, name)]
}

// Done notes that tensor i is written, not yet durable. About once every
// Every it starts a flush in the background, so the workers calling it
// never wait for the disk.
func (j *TensorJournal) Done(i int, name string) {
	j.mu.Lock()
	j.pending = append(j.pending, unitName(i, name))
	due := !j.flushing && time.Since(j.last) > j.Every
	if due {
		j.flushing = true
		j.bg.Add(1)
	}
	j.mu.Unlock()
	if due {
		go func() {
			defer j.bg.Done()
			j.Flush() // an error leaves the tensors pending for the next flush
			j.mu.Lock()
			j.flushing = false
			j.mu.Unlock()
		}()
	}
}

// Flush fsyncs the partial file, then records the tensors reported done
// before it started.
func (j *TensorJournal) Flush() error {
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

func (j *TensorJournal) record(units []string) error {
	es := make([]journal.Entry, len(units))
	for k, u := range units {
		es[k] = journal.Entry{Unit: u}
	}
	if j.noSync {
		return j.log.AppendNoSync(es...)
	}
	for _, p := range j.partials {
		pf, err := os.Open(p)
		if err != nil {
			return err
		}
		err = pf.Sync()
		pf.Close()
		if err != nil {
			return err
		}
	}
	return j.log.Append(es...)
}

// partialLeft reports whether any of the partial files is there.
func (j *TensorJournal) partialLeft() bool {
	for _, p := range j.partials {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			return true
		}
	}
	return false
}

// Durable is how many tensors the journal holds as durable.
func (j *TensorJournal) Durable() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.durableM)
}

// Close waits for a background flush and keeps the journal.
func (j *TensorJournal) Close() error {
	j.bg.Wait()
	return j.log.Close()
}

// Remove waits for a background flush and deletes the journal.
func (j *TensorJournal) Remove() error {
	j.bg.Wait()
	return j.log.Remove()
}

// Leftover is what a failed or interrupted write leaves to resume: the
// partial file ("" when none was made, and then nothing is left), the
// journal, how many tensors it holds as durable, and JournalErr if
// recording the last finished tensors failed (a resume then starts from
// the ones recorded before).
type Leftover struct {
	Partial    string
	Partials   []string // every part's partial file, for a split (Partial is the first)
	Journal    string
	Durable    int
	JournalErr error
}

// Abandon ends the journal of a write that failed or was interrupted: it
// records the tensors finished so far (fsyncing the partial file first)
// and keeps the journal beside the partial file for a resume; when no
// partial file was made (a disk too full to reserve it) it removes the
// journal too, leaving nothing.
func (j *TensorJournal) Abandon() Leftover {
	lo := Leftover{JournalErr: j.Flush()}
	j.Close()
	if !j.partialLeft() {
		j.log.Remove()
		return Leftover{}
	}
	lo.Partial, lo.Journal, lo.Durable = j.partials[0], j.path, j.Durable()
	if len(j.partials) > 1 {
		lo.Partials = j.partials
	}
	return lo
}
