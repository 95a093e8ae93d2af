package merge

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"

	"github.com/ferry-llm/ferry/internal/fsutil"
)

// JournalName is the resume journal in the output directory: the plan key
// and the sha256 of every shard finished so far. It stays after a
// successful merge so a re-run verifies and skips everything.
const JournalName = ".ferry-merge-journal.json"

const maxJournalSize = 64 << 20

type journal struct {
	path     string
	Version  int                   `json:"version"`
	Key      string                `json:"key"`
	Files    map[string]FileDigest `json:"files"`
	Complete bool                  `json:"complete"`
}

// openJournal loads the journal of an earlier run of the same plan, or
// starts one. A journal of a different plan is an error: the directory
// holds another merge.
func openJournal(outDir, key string) (*journal, error) {
	p := filepath.Join(outDir, JournalName)
	j := &journal{path: p, Version: 1, Key: key, Files: map[string]FileDigest{}}
	data, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return j, j.save()
	}
	if err != nil {
		return nil, err
	}
	var old journal
	if len(data) > maxJournalSize || json.Unmarshal(data, &old) != nil || old.Version != 1 {
		return nil, inputErr(p, "", -1, ErrJournal, "unreadable journal; remove the output directory to start over")
	}
	if old.Key != key {
		return nil, inputErr(p, "", -1, ErrJournal, "it was made for other inputs or options (plan key %.12s…, this plan %.12s…); choose another --out or remove it", old.Key, key)
	}
	if old.Files != nil {
		j.Files = old.Files
	}
	return j, nil
}

func (j *journal) save() error {
	data, err := json.MarshalIndent(j, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(j.path, append(data, '\n'), 0o644)
}

func (j *journal) record(d FileDigest) error {
	j.Files[d.Name] = d
	j.Complete = false
	return j.save()
}

func (j *journal) complete() error {
	j.Complete = true
	return j.save()
}
