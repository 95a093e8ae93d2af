package manifest

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// maxJournalSize bounds a journal file before it is read into memory.
const maxJournalSize = 256 << 20

// Unit is one finished unit of a journaled output.
type Unit struct {
	Name string `json:"unit"`
	End  int64  `json:"end"` // offset just past the unit's last byte
}

// journalLine is one line of a journal file. The first line carries Ref;
// unit lines carry Unit, End and State; the last line of a committed output
// carries Commit, Size and Stamp.
type journalLine struct {
	Ref    string `json:"ref,omitempty"`
	Unit   string `json:"unit,omitempty"`
	End    int64  `json:"end,omitempty"`
	State  []byte `json:"state,omitempty"` // marshaled sha256 state at End
	Commit Digest `json:"commit,omitempty"`
	Size   int64  `json:"size,omitempty"`
	Stamp  *Stamp `json:"stamp,omitempty"`
}

// Journal writes one big output file in units so that a killed run resumes
// where it stopped. The data goes to <store>/ingest/<key>/<ref>/data; after
// each unit the data is fsynced and a journal line records the unit's end
// offset and the marshaled sha256 state (crypto/sha256 implements
// encoding.BinaryMarshaler), then the journal is fsynced. Reopening the same
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
	jf    *os.File
	data  *os.File
	h     hash.Hash
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
	j := &Journal{s: s, ref: ref, dir: dir, h: sha256.New()}
	jf, err := os.OpenFile(filepath.Join(dir, "journal"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	j.jf = jf
	if err := j.load(); err != nil {
		jf.Close()
		return nil, err
	}
	return j, nil
}

func (j *Journal) load() error {
	fi, err := j.jf.Stat()
	if err != nil {
		return err
	}
	if fi.Size() > maxJournalSize {
		return j.reset()
	}
	raw, err := io.ReadAll(io.LimitReader(j.jf, maxJournalSize))
	if err != nil {
		return err
	}
	var lines []journalLine
	good := 0 // bytes of complete, parseable lines
	for len(raw[good:]) > 0 {
		i := bytes.IndexByte(raw[good:], '\n')
		if i < 0 {
			break // torn last line
		}
		var l journalLine
		if json.Unmarshal(raw[good:good+i], &l) != nil {
			break
		}
		lines = append(lines, l)
		good += i + 1
	}
	if len(lines) == 0 || lines[0].Ref != j.ref {
		return j.reset()
	}
	var last *journalLine
	for i := 1; i < len(lines); i++ {
		l := lines[i]
		switch {
		case l.Commit != "":
			if l.Commit.Validate() != nil || l.Stamp == nil {
				return j.reset()
			}
			st, err := StatStamp(j.s.BlobPath(l.Commit))
			if err != nil || st != *l.Stamp || st.Size != l.Size {
				return j.reset() // the blob went away or changed: start over
			}
			j.commit = &Output{Path: j.ref, Digest: l.Commit, Size: l.Size}
			j.off = l.Size
			// The process that committed may have died before the
			// manifest recorded the blob's stamp.
			j.s.setStamp(l.Commit, st)
			return nil
		case l.Unit != "":
			if l.End < j.off || len(l.State) == 0 {
				return j.reset()
			}
			j.units = append(j.units, Unit{Name: l.Unit, End: l.End})
			j.off = l.End
			last = &lines[i]
		default:
			return j.reset()
		}
	}
	if err := j.jf.Truncate(int64(good)); err != nil {
		return err
	}
	if _, err := j.jf.Seek(int64(good), io.SeekStart); err != nil {
		return err
	}
	if last != nil {
		if err := j.h.(encoding.BinaryUnmarshaler).UnmarshalBinary(last.State); err != nil {
			return j.reset()
		}
	}
	dataPath := filepath.Join(j.dir, "data")
	if last != nil {
		// A crash between Commit's rename and its journal line leaves no
		// data file but the blob: the hash state of the last unit names it.
		if _, err := os.Stat(dataPath); errors.Is(err, fs.ErrNotExist) {
			h := sha256.New()
			if h.(encoding.BinaryUnmarshaler).UnmarshalBinary(last.State) == nil {
				d := NewDigest(h.Sum(nil))
				if st, err := StatStamp(j.s.BlobPath(d)); err == nil && st.Size == j.off {
					if err := j.appendLine(journalLine{Commit: d, Size: j.off, Stamp: &st}); err != nil {
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
	return nil
}

// reset discards everything and starts an empty journal.
func (j *Journal) reset() error {
	if j.data != nil {
		j.data.Close()
		j.data = nil
	}
	j.units, j.off, j.commit = nil, 0, nil
	j.h = sha256.New()
	if err := os.Remove(filepath.Join(j.dir, "data")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := j.jf.Truncate(0); err != nil {
		return err
	}
	if _, err := j.jf.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if err := j.appendLine(journalLine{Ref: j.ref}); err != nil {
		return err
	}
	data, err := os.OpenFile(filepath.Join(j.dir, "data"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	j.data = data
	return nil
}

func (j *Journal) appendLine(l journalLine) error {
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(j.jf)
	w.Write(b)
	w.WriteByte('\n')
	if err := w.Flush(); err != nil {
		return err
	}
	return j.jf.Sync()
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
	n, err := j.data.Write(p)
	j.h.Write(p[:n])
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
	st, err := j.h.(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil {
		j.err = err
		return err
	}
	if err := j.appendLine(journalLine{Unit: name, End: j.off, State: st}); err != nil {
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
	d := NewDigest(j.h.Sum(nil))
	if err := j.s.place(filepath.Join(j.dir, "data"), d, j.off); err != nil {
		return Output{}, err
	}
	st, err := StatStamp(j.s.BlobPath(d))
	if err != nil {
		return Output{}, err
	}
	if err := j.appendLine(journalLine{Commit: d, Size: j.off, Stamp: &st}); err != nil {
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
	if j.jf != nil {
		if e := j.jf.Close(); err == nil {
			err = e
		}
		j.jf = nil
	}
	return err
}

// RemoveIngest drops the journals of the stage run with key; the runner calls
// it once the stage's record is committed, or before a forced re-run.
func (s *Store) RemoveIngest(key string) error {
	return os.RemoveAll(s.IngestDir(key))
}
