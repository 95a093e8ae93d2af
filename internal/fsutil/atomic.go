// Package fsutil holds the crash-safe file primitives every writer in ferry
// uses: a file only ever appears under its final name complete and fsynced.
package fsutil

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// PartialSuffix marks a file still being written. A name ending in it is
// never a finished output.
const PartialSuffix = ".partial"

// AtomicFile is a file written under a temporary name in the target's
// directory and renamed to the target by Commit. Until Commit succeeds the
// target is untouched; Abort (or a crash) leaves at most a temp file whose
// name ends in PartialSuffix.
type AtomicFile struct {
	*os.File
	target string
	perm   os.FileMode
	done   bool
}

// DefaultPerm is the mode a committed file gets unless SetPerm says
// otherwise (os.CreateTemp would leave 0600).
const DefaultPerm os.FileMode = 0o644

// CreateAtomic opens a temp file next to target.
func CreateAtomic(target string) (*AtomicFile, error) {
	dir, base := filepath.Split(target)
	if dir == "" {
		dir = "."
	}
	if st, err := os.Stat(target); err == nil && st.IsDir() {
		return nil, fmt.Errorf("%s: is a directory", target)
	}
	f, err := os.CreateTemp(dir, "."+base+".*"+PartialSuffix)
	if err != nil {
		// Name the target, not the temp file the user never asked for.
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, fmt.Errorf("%s: creating: %w", target, err)
	}
	return &AtomicFile{File: f, target: target, perm: DefaultPerm}, nil
}

// SetPerm sets the mode the file gets at Commit.
func (a *AtomicFile) SetPerm(perm os.FileMode) { a.perm = perm }

// Target is the final path.
func (a *AtomicFile) Target() string { return a.target }

// Commit fsyncs the data, closes the file, renames it to the target and
// fsyncs the directory. On error the temp file is removed.
func (a *AtomicFile) Commit() (err error) {
	if a.done {
		return errors.New("fsutil: commit after commit or abort")
	}
	a.done = true
	tmp := a.File.Name()
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if err := a.File.Chmod(a.perm); err != nil {
		a.File.Close()
		return fmt.Errorf("%s: chmod: %w", a.target, err)
	}
	if err := a.File.Sync(); err != nil {
		a.File.Close()
		return fmt.Errorf("%s: fsync: %w", a.target, err)
	}
	if err := a.File.Close(); err != nil {
		return fmt.Errorf("%s: close: %w", a.target, err)
	}
	if err := os.Rename(tmp, a.target); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(a.target))
}

// Abort closes and removes the temp file. It is safe after Commit (no-op).
func (a *AtomicFile) Abort() {
	if a.done {
		return
	}
	a.done = true
	a.File.Close()
	os.Remove(a.File.Name())
}

// SyncDir fsyncs a directory so a rename or create in it is durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return fmt.Errorf("%s: fsync dir: %w", dir, err)
	}
	return nil
}

// WriteFileAtomic writes data to path through an AtomicFile.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	a, err := CreateAtomic(path)
	if err != nil {
		return err
	}
	if _, err := a.Write(data); err != nil {
		a.Abort()
		return err
	}
	a.SetPerm(perm)
	return a.Commit()
}
