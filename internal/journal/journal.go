// Package journal is ferry's one resume journal: an append-only file of
// JSON lines that says which units of a long write are durable. Every
// resumable writer keeps one (the store's journaled blobs and resumable
// hashes, merge, gguf convert); what a unit is belongs to the writer.
//
// The first line names what the journal belongs to (Ref: a plan key, a
// stamp of the inputs and options). A journal opened with another Ref, or
// one that does not parse, starts over: stale units are never trusted. A
// torn last line (a crash inside an append) is dropped. Each Append is
// fsynced before it returns, so a unit is recorded only after the writer
// made its bytes durable; AppendNoSync is for units that only save work.
package journal

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/ferry-llm/ferry/internal/fsutil"
)

// MaxSize bounds a journal file before it is read into memory; a larger one
// starts over.
const MaxSize = 256 << 20

// Entry is one line. A unit line carries Unit and, for a writer that
// resumes its hash, End (the offset just past the unit) and State
// (hashing.Writer's saved state at End). A commit line carries Commit (the
// finished output's digest), Size and Stamp (the writer's identity of the
// finished file: size, mtime, inode), and Unit where the journal holds
// several outputs.
type Entry struct {
	Ref    string          `json:"ref,omitempty"`
	Unit   string          `json:"unit,omitempty"`
	End    int64           `json:"end,omitempty"`
	State  []byte          `json:"state,omitempty"`
	Commit string          `json:"commit,omitempty"`
	Size   int64           `json:"size,omitempty"`
	Stamp  json.RawMessage `json:"stamp,omitempty"`
}

// Log is an open journal.
type Log struct {
	path string
	f    *os.File
}

// Open opens or creates the journal at path for ref and returns the entries
// after the ref line that an earlier run recorded. fresh reports that the
// journal was started over (it did not exist, belonged to another ref or
// did not parse).
func Open(path, ref string) (l *Log, entries []Entry, fresh bool, err error) {
	if ref == "" {
		return nil, nil, false, errors.New("journal: empty ref")
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, nil, false, err
	}
	l = &Log{path: path, f: f}
	entries, good, err := l.load(ref)
	if err != nil {
		f.Close()
		return nil, nil, false, err
	}
	if good == 0 {
		if err := l.Reset(ref); err != nil {
			f.Close()
			return nil, nil, false, err
		}
		return l, nil, true, nil
	}
	// Drop a torn tail so the next append starts on a line of its own.
	if err := f.Truncate(good); err != nil {
		f.Close()
		return nil, nil, false, fmt.Errorf("%s: %w", path, err)
	}
	if _, err := f.Seek(good, io.SeekStart); err != nil {
		f.Close()
		return nil, nil, false, err
	}
	return l, entries, false, nil
}

// load reads the lines after a matching ref line; good is the length of
// the intact prefix (0: start over).
func (l *Log) load(ref string) ([]Entry, int64, error) {
	fi, err := l.f.Stat()
	if err != nil {
		return nil, 0, err
	}
	if fi.Size() > MaxSize {
		return nil, 0, nil
	}
	raw, err := io.ReadAll(io.LimitReader(l.f, MaxSize))
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", l.path, err)
	}
	var out []Entry
	good := 0
	for first := true; len(raw[good:]) > 0; first = false {
		i := bytes.IndexByte(raw[good:], '\n')
		if i < 0 {
			break // torn last line
		}
		var e Entry
		if json.Unmarshal(raw[good:good+i], &e) != nil {
			break
		}
		if first {
			if e.Ref != ref {
				return nil, 0, nil
			}
		} else {
			out = append(out, e)
		}
		good += i + 1
	}
	return out, int64(good), nil
}

// Reset empties the journal and starts it for ref.
func (l *Log) Reset(ref string) error {
	if err := l.f.Truncate(0); err != nil {
		return fmt.Errorf("%s: %w", l.path, err)
	}
	if _, err := l.f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	return l.Append(Entry{Ref: ref})
}

// Append writes the entries and fsyncs the journal.
func (l *Log) Append(es ...Entry) error {
	if err := l.write(es); err != nil {
		return err
	}
	if err := l.f.Sync(); err != nil {
		return fmt.Errorf("%s: fsync: %w", l.path, err)
	}
	return nil
}

// AppendNoSync writes the entries without fsyncing them, for units that
// only save work: a hash of a file that is read, not written, whose bytes
// are durable without the journal. A killed process loses nothing (the
// kernel holds the lines); a crash may lose the last lines, or tear one,
// and the writer then resumes from an earlier unit. Fsyncing every unit
// would cost about as much as hashing it on a loaded machine.
func (l *Log) AppendNoSync(es ...Entry) error { return l.write(es) }

func (l *Log) write(es []Entry) error {
	var b bytes.Buffer
	for _, e := range es {
		line, err := json.Marshal(e)
		if err != nil {
			return err
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	w := bufio.NewWriter(l.f)
	w.Write(b.Bytes())
	if err := w.Flush(); err != nil {
		return fmt.Errorf("%s: %w", l.path, err)
	}
	return nil
}

// Path is the journal's file.
func (l *Log) Path() string { return l.path }

// Close keeps the journal for a later resume.
func (l *Log) Close() error {
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// Remove closes the journal and deletes it (the output it served is
// finished, or nothing it recorded is left), fsyncing the directory.
func (l *Log) Remove() error {
	l.Close()
	if err := os.Remove(l.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return fsutil.SyncDir(filepath.Dir(l.path))
}

// Ref is the ref of the journal at path: "" when its first line does not
// parse; an error wrapping fs.ErrNotExist when there is none. A writer
// checks it before Open when a journal of another ref must be refused
// rather than started over (the output belongs to someone else).
func Ref(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	line, err := bufio.NewReader(io.LimitReader(f, 1<<20)).ReadBytes('\n')
	if err != nil {
		return "", nil
	}
	var e Entry
	if json.Unmarshal(line, &e) != nil {
		return "", nil
	}
	return e.Ref, nil
}
