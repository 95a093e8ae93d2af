package transfer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/fsutil"
)

// destIndex is what earlier runs verified at one destination: each file
// with its size, the modification time it was left with, and its digest.
// A file the destination still holds with that size and mtime is taken as
// verified without reading it (rsync's quick check, with the digest of a
// check that did read it behind it); Options.Verify reads it again. It is
// kept in the state directory, one per destination, and rewritten whole
// at the end of every run.
type destIndex struct {
	path  string
	mu    sync.Mutex
	files map[string]indexEntry
	// hashCmd is how the destination verified files (HostReport.HashCommand)
	// when they were last checked there: what a run that trusts them all
	// reports.
	hashCmd string
	dirty   bool
}

type indexEntry struct {
	Size   int64         `json:"size"`
	Mtime  int64         `json:"mtime"` // unix seconds, as the destination lists it
	Digest digest.Digest `json:"digest"`
}

type indexFile struct {
	Version     int                   `json:"version"`
	Destination string                `json:"destination"`
	HashCommand string                `json:"hash_command,omitempty"`
	Files       map[string]indexEntry `json:"files"`
}

// maxIndex bounds an index file before it is read (a larger one is taken
// as absent: its files are checked again, not trusted).
const maxIndex = 256 << 20

// IndexPath is where the index of destination dest lives in stateDir.
func IndexPath(stateDir, dest string) string {
	s := sha256.Sum256([]byte(dest))
	return filepath.Join(stateDir, "transfer-"+hex.EncodeToString(s[:8])+".verified.json")
}

// loadIndex reads dest's index; one that is missing, unreadable or of
// another destination is empty (what it held is checked again).
func loadIndex(stateDir, dest string) (*destIndex, error) {
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return nil, err
	}
	x := &destIndex{path: IndexPath(stateDir, dest), files: map[string]indexEntry{}}
	f, err := os.Open(x.path)
	if errors.Is(err, fs.ErrNotExist) {
		return x, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var raw indexFile
	if err := json.NewDecoder(io.LimitReader(f, maxIndex)).Decode(&raw); err != nil || raw.Version != 1 || raw.Destination != dest {
		return x, nil
	}
	x.hashCmd = raw.HashCommand
	for rel, e := range raw.Files {
		if e.Digest.Validate() == nil && e.Size >= 0 {
			x.files[rel] = e
		}
	}
	return x, nil
}

func (x *destIndex) get(rel string) (indexEntry, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	e, ok := x.files[rel]
	return e, ok
}

func (x *destIndex) put(rel string, e indexEntry) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if old, ok := x.files[rel]; !ok || old != e {
		x.files[rel] = e
		x.dirty = true
	}
}

// covers reports whether an earlier run verified every file of p at the
// destination (as they are now planned).
func (x *destIndex) covers(p *Plan) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, f := range p.Files {
		if e, ok := x.files[f.Rel]; !ok || e.Digest != f.Digest || e.Size != f.Size {
			return false
		}
	}
	return true
}

// verifiedBy records how the destination verifies files now.
func (x *destIndex) verifiedBy(cmd string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if cmd != "" && cmd != x.hashCmd {
		x.hashCmd = cmd
		x.dirty = true
	}
}

func (x *destIndex) del(rel string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, ok := x.files[rel]; ok {
		delete(x.files, rel)
		x.dirty = true
	}
}

// save writes the index atomically, if it changed.
func (x *destIndex) save(dest string) error {
	if x == nil {
		return nil // never loaded: the run stopped before it
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.dirty {
		return nil
	}
	b, err := json.Marshal(indexFile{Version: 1, Destination: dest, HashCommand: x.hashCmd, Files: x.files})
	if err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(x.path, b, 0o644); err != nil {
		return fmt.Errorf("saving the record of %s: %w", dest, err)
	}
	x.dirty = false
	return nil
}
