package manifest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/internal/journal"
)

// Unit is one finished unit of a journaled output.
type Unit struct {
	Name string `json:"unit"`
	End  int64  `json:"end"` // offset just past the unit's last byte
}

// Journal writes one big output file in units so that a killed run resumes
// where it stopped. The data goes to <store>/ingest/<key>/<ref>/data; after
// each unit the data is fsynced and a line of the internal/journal journal
// (its ref the output path) records the unit's end offset and the sha256
// state there (hashing.Writer), then the journal is fsynced. Reopening the same
// key and ref truncates the data to the last finished unit and restores the
// hash, so finished units are neither rewritten nor re-read, and the final
// digest is that of an uninterrupted write.
//
// A torn last journal line (a crash inside the append) is ignored. After
// Commit the journal keeps a commit line until the stage's record is in the
// manifest (RemoveIngest), so a crash between the two does not redo work.
type Journal struct {
	s     *Store
	ref   string
	dir   string
	log   *journal.Log
	data  *os.File
	h     *hashing.Writer // over data
	off   int64
	units []Unit
	// committed output, if the journal was already committed
	commit *Output
	err    error
}

// ErrJournalCorrupt reports a journal that does not belong to its ref.
var ErrJournalCorrupt = errors.New("manifest: corrupt journal")

// OpenJournal opens or resumes the journaled output ref (a relative output
// path) of the stage run with key.
func (s *Store) OpenJournal(key, ref string) (*Journal, error) {
	if err := checkRelPath(ref); err != nil {
		return nil, err
	}
	dir := filepath.Join(s.IngestDir(key), DigestOf([]byte(ref)).Short())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	log, entries, fresh, err := journal.Open(filepath.Join(dir, "journal"), ref)
	if err != nil {
		return nil, err
	}
	j := &Journal{s: s, ref: ref, dir: dir, log: log}
	if err := j.load(entries, fresh); err != nil {
		log.Close()
		return nil, err
	}
	return j, nil
}

func (j *Journal) load(entries []journal.Entry, fresh bool) error {
	if fresh {
		return j.reset()
	}
	var last *journal.Entry
	for i, e := range entries {
		switch {
		case e.Commit != "":
			var st Stamp
			d := Digest(e.Commit)
			if d.Validate() != nil || json.Unmarshal(e.Stamp, &st) != nil {
				return j.reset()
			}
			cur, err := StatStamp(j.s.BlobPath(d))
			if err != nil || cur != st || cur.Size != e.Size {
				return j.reset() // the blob went away or changed: start over
			}
			j.commit = &Output{Path: j.ref, Digest: d, Size: e.Size}
			j.off = e.Size
			// The process that committed may have died before the
			// manifest recorded the blob's stamp.
			j.s.setStamp(d, cur)
			return nil
		case e.Unit != "":
			if e.End < j.off || len(e.State) == 0 {
				return j.reset()
			}
			j.units = append(j.units, Unit{Name: e.Unit, End: e.End})
			j.off = e.End
			last = &entries[i]
		default:
			return j.reset()
		}
	}
	dataPath := filepath.Join(j.dir, "data")
	if last != nil {
		// A crash between Commit's rename and its journal line leaves no
		// data file but the blob: the hash state of the last unit names it.
		if _, err := os.Stat(dataPath); errors.Is(err, fs.ErrNotExist) {
			if h, err := hashing.Resume(nil, last.State, last.End); err == nil {
				sum := h.Sum()
				d := NewDigest(sum[:])
				if st, err := StatStamp(j.s.BlobPath(d)); err == nil && st.Size == j.off {
					if err := j.appendCommit(d, j.off, st); err != nil {
						return err
					}
					j.commit = &Output{Path: j.ref, Digest: d, Size: j.off}
					j.s.setStamp(d, st)
					return nil
				}
			}
		}
	}
	os.Chmod(dataPath, 0o644) // a crash inside Commit may have left it read-only
	data, err := os.OpenFile(dataPath, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	dfi, err := data.Stat()
	if err != nil {
		data.Close()
		return err
	}
	if dfi.Size() < j.off {
		data.Close()
		return j.reset() // the data lost finished units: start over
	}
	if err := data.Truncate(j.off); err != nil {
		data.Close()
		return err
	}
	if _, err := data.Seek(j.off, io.SeekStart); err != nil {
		data.Close()
		return err
	}
	j.data = data
	j.h = hashing.NewWriter(data)
	if last != nil {
		if j.h, err = hashing.Resume(data, last.State, last.End); err != nil {
			data.Close()
			j.data = nil
			return j.reset()
		}
	}
	return nil
}

// reset discards everything and starts an empty journal.
func (j *Journal) reset() error {
	if j.data != nil {
		j.data.Close()
		j.data = nil
	}
	j.units, j.off, j.commit = nil, 0, nil
	if err := os.Remove(filepath.Join(j.dir, "data")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := j.log.Reset(j.ref); err != nil {
		return err
	}
	data, err := os.OpenFile(filepath.Join(j.dir, "data"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	j.data = data
	j.h = hashing.NewWriter(data)
	return nil
}

func (j *Journal) appendCommit(d Digest, size int64, st Stamp) error {
	raw, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return j.log.Append(journal.Entry{Commit: string(d), Size: size, Stamp: raw})
}

// Units lists the finished units in order. A stage skips as many leading
// units of its plan as this returns (checking their names).
func (j *Journal) Units() []Unit { return append([]Unit(nil), j.units...) }

// Offset is where the next unit starts.
func (j *Journal) Offset() int64 { return j.off }

// Committed returns the output if the journal was committed by an earlier
// run whose record did not reach the manifest.
func (j *Journal) Committed() (Output, bool) {
	if j.commit == nil {
		return Output{}, false
	}
	return *j.commit, true
}

// Write appends p to the current unit.
func (j *Journal) Write(p []byte) (int, error) {
	if j.err != nil {
		return 0, j.err
	}
	if j.commit != nil {
		j.err = ErrWriterClosed
		return 0, j.err
	}
	n, err := j.h.Write(p)
	j.off += int64(n)
	if err != nil {
		j.err = err
	}
	return n, err
}

// EndUnit makes the unit written since the last EndUnit durable: it fsyncs
// the data, then appends and fsyncs a journal line with the unit's name, end
// offset and hash state.
func (j *Journal) EndUnit(name string) error {
	if j.err != nil {
		return j.err
	}
	if name == "" {
		return errors.New("manifest: empty unit name")
	}
	if err := j.data.Sync(); err != nil {
		j.err = err
		return err
	}
	if err := j.log.Append(journal.Entry{Unit: name, End: j.off, State: j.h.State()}); err != nil {
		j.err = err
		return err
	}
	j.units = append(j.units, Unit{Name: name, End: j.off})
	return nil
}

// Commit finishes the output: fsync, rename into the blobs (fsyncing the
// directory), then a commit line in the journal. size < 0 skips the length
// check. Committing an already committed journal returns its output.
func (j *Journal) Commit(size int64) (Output, error) {
	if j.commit != nil {
		return *j.commit, nil
	}
	if j.err != nil {
		return Output{}, j.err
	}
	if size >= 0 && j.off != size {
		return Output{}, fmt.Errorf("%s: %w: wrote %d bytes, expected %d", j.ref, ErrSizeMismatch, j.off, size)
	}
	if err := j.data.Sync(); err != nil {
		return Output{}, err
	}
	if err := j.data.Close(); err != nil {
		return Output{}, err
	}
	j.data = nil
	sum := j.h.Sum()
	d := NewDigest(sum[:])
	if err := j.s.place(filepath.Join(j.dir, "data"), d, j.off); err != nil {
		return Output{}, err
	}
	st, err := StatStamp(j.s.BlobPath(d))
	if err != nil {
		return Output{}, err
	}
	if err := j.appendCommit(d, j.off, st); err != nil {
		return Output{}, err
	}
	j.commit = &Output{Path: j.ref, Digest: d, Size: j.off}
	j.err = ErrWriterClosed
	return *j.commit, nil
}

// Close releases the files and keeps the journal for a later resume.
func (j *Journal) Close() error {
	var err error
	if j.data != nil {
		err = j.data.Close()
		j.data = nil
	}
	if e := j.log.Close(); err == nil {
		err = e
	}
	return err
}

// RemoveIngest drops the journals of the stage run with key; the runner calls
// it once the stage's record is committed, or before a forced re-run.
func (s *Store) RemoveIngest(key string) error {
	return os.RemoveAll(s.IngestDir(key))
}
