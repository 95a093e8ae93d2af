package convert

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/safetensors"
)

// Journal records which tensors of a partial GGUF (out + ".partial") are
// durable, so an interrupted Write resumes without rewriting them: tensors
// reported done are kept pending until the partial file has been fsynced
// (at most once a second, and at Flush), then appended to the journal and
// the journal fsynced. Its first line is the stamp of the plan and inputs
// it belongs to; a journal with another stamp (other inputs or options) is
// started afresh, so stale bytes are never kept. Lines are "index name"
// and, once Write renamed the file into place, "complete NAME".
type Journal struct {
	mu       sync.Mutex
	partial  string
	done     map[string]bool
	pending  []string
	last     time.Time
	flushing bool // a background Flush is running
	f        *os.File

	flushMu sync.Mutex     // one Flush at a time
	bg      sync.WaitGroup // background flushes, waited for by Close
}

// maxJournal bounds how much of a journal is read back.
const maxJournal = 64 << 20

const (
	stampPrefix  = "stamp "
	completeMark = "complete "
)

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

// OpenJournal opens (or creates) the journal at path for the output out
// and the conversion identified by stamp.
func OpenJournal(path, out, stamp string) (*Journal, error) {
	j := &Journal{partial: gguf.PartialPath(out), done: map[string]bool{}, last: time.Now()}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	_, perr := os.Stat(j.partial)
	_, oerr := os.Stat(out)
	fresh := errors.Is(perr, fs.ErrNotExist) && errors.Is(oerr, fs.ErrNotExist) // nothing to resume
	sc := bufio.NewScanner(io.LimitReader(f, maxJournal))
	first := true
	for sc.Scan() && !fresh {
		line := sc.Text()
		if first {
			first = false
			if line != stampPrefix+stamp {
				fresh = true // another conversion's journal
			}
			continue
		}
		i, name, ok := strings.Cut(line, " ")
		if _, err := strconv.Atoi(i); ok && err == nil && name != "" || strings.HasPrefix(line, completeMark) {
			j.done[line] = true
		}
	}
	if fresh || first {
		j.done = map[string]bool{}
		if err := f.Truncate(0); err == nil {
			_, err = f.WriteAt([]byte(stampPrefix+stamp+"\n"), 0)
		}
		if err == nil {
			err = f.Sync()
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		f.Close()
		return nil, err
	}
	j.f = f
	return j, nil
}

// Has reports whether tensor i (name) was recorded as durable: pass it as
// WriteOptions.Verify (with Resume).
func (j *Journal) Has(i int, name string, _ *io.SectionReader) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.done[strconv.Itoa(i)+" "+name]
}

// Done is WriteOptions.TensorDone: tensor i is written, not yet durable.
// About once a second it starts a Flush in the background, so the
// workers calling it never wait for the disk.
func (j *Journal) Done(i int, name string) {
	j.mu.Lock()
	j.pending = append(j.pending, strconv.Itoa(i)+" "+name)
	due := !j.flushing && time.Since(j.last) > time.Second
	if due {
		j.flushing = true
		j.bg.Add(1)
	}
	j.mu.Unlock()
	if due {
		go func() {
			defer j.bg.Done()
			j.Flush() // an error leaves the tensors pending for the next Flush
			j.mu.Lock()
			j.flushing = false
			j.mu.Unlock()
		}()
	}
}

// Flush fsyncs the partial file, then records the tensors reported done
// before it started.
func (j *Journal) Flush() error {
	j.flushMu.Lock()
	defer j.flushMu.Unlock()
	j.mu.Lock()
	lines := j.pending
	j.pending = nil
	j.last = time.Now()
	j.mu.Unlock()
	if len(lines) == 0 {
		return nil
	}
	err := j.record(lines)
	j.mu.Lock()
	if err != nil {
		j.pending = append(lines, j.pending...)
	} else {
		for _, l := range lines {
			j.done[l] = true
		}
	}
	j.mu.Unlock()
	return err
}

func (j *Journal) record(lines []string) error {
	pf, err := os.Open(j.partial)
	if err != nil {
		return err
	}
	err = pf.Sync()
	pf.Close()
	if err != nil {
		return err
	}
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	if _, err := j.f.WriteString(b.String()); err != nil {
		return err
	}
	return j.f.Sync()
}

// Durable is how many tensors the journal holds as durable.
func (j *Journal) Durable() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	n := 0
	for l := range j.done {
		if !strings.HasPrefix(l, completeMark) {
			n++
		}
	}
	return n
}

// Close waits for a background flush and closes the journal file.
func (j *Journal) Close() error {
	j.bg.Wait()
	return j.f.Close()
}

// MarkComplete records that out is finished (Write has renamed it).
func (j *Journal) MarkComplete(out string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	line := completeMark + filepath.Base(out)
	if _, err := j.f.WriteString(line + "\n"); err != nil {
		return err
	}
	j.done[line] = true
	return j.f.Sync()
}

// Complete reports whether an earlier run finished out and it is still
// there.
func (j *Journal) Complete(out string) bool {
	j.mu.Lock()
	ok := j.done[completeMark+filepath.Base(out)]
	j.mu.Unlock()
	if !ok {
		return false
	}
	_, err := os.Stat(out)
	return err == nil
}
