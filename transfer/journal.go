package transfer

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/journal"
)

// The resume journal of one destination (internal/journal, in
// Options.StateDir, named by a digest of the destination): its ref is a
// digest of the plan (chunk size, every file's path, size and digest), so
// a changed source starts it over. Its lines:
//
//	{"unit":"p:REL","size":N}                     REL.partial (re)created with N bytes (-1: dropped)
//	{"unit":"c:REL#I","end":E,"commit":"sha256:…"} chunk I (ending at E) written and fsynced there
//	{"unit":"f:REL","commit":"sha256:…"}           REL verified and renamed into place
//
// A chunk line is appended only after the remote server acknowledged
// every write of the chunk and its fsync@openssh.com; a new partial line
// drops the chunk lines before it, and is appended before the partial is
// created or truncated (a partial line whose file is missing or of
// another size only makes the next run create it again). The digest of each chunk is what the
// final check compares read-back chunks with, so a file that fails
// verification gets only its bad chunks again.
const (
	jPartial = iota
	jChunk
	jDone
)

type jEntry struct {
	kind   int
	rel    string
	size   int64
	chunk  int
	end    int64
	digest digest.Digest
}

// journalRef is the plan's identity for the journal.
func journalRef(p *Plan, dest string) string {
	h := sha256.New()
	fmt.Fprintf(h, "ferry transfer 1\x00%s\x00%d\x00", dest, p.ChunkSize)
	for _, f := range p.Files {
		fmt.Fprintf(h, "%s\x00%d\x00%s\x00", f.Rel, f.Size, f.Digest)
	}
	return "transfer:" + hex.EncodeToString(h.Sum(nil))
}

// JournalPath is where the journal of destination dest lives in stateDir.
func JournalPath(stateDir, dest string) string {
	s := sha256.Sum256([]byte(dest))
	return filepath.Join(stateDir, "transfer-"+hex.EncodeToString(s[:8])+".journal")
}

func (h *host) openJournal() error {
	jl, entries, _, err := journal.Open(JournalPath(h.o.StateDir, h.d.Name), journalRef(h.p, h.d.Name))
	if err != nil {
		return err
	}
	h.jl = jl
	for _, e := range entries {
		kind, rest, ok := strings.Cut(e.Unit, ":")
		if !ok {
			continue
		}
		switch kind {
		case "p":
			st := h.stateOf(rest)
			st.partial, st.chunks = e.Size, map[int]digest.Digest{}
		case "c":
			rel, idx, ok := strings.Cut(rest, "#")
			i, err := strconv.Atoi(idx)
			d, derr := digest.Parse(e.Commit)
			if !ok || err != nil || derr != nil || i < 0 {
				continue
			}
			h.stateOf(rel).chunks[i] = d
		case "f":
			if d, err := digest.Parse(e.Commit); err == nil {
				h.stateOf(rest).done = d
			}
		}
	}
	return nil
}

// stateOf returns the journal's state of file rel.
func (h *host) stateOf(rel string) *fileState {
	h.jmu.Lock()
	defer h.jmu.Unlock()
	st := h.state[rel]
	if st == nil {
		st = &fileState{partial: -1, chunks: map[int]digest.Digest{}}
		h.state[rel] = st
	}
	return st
}

// journal appends e (fsynced).
func (h *host) journal(e jEntry) error {
	var je journal.Entry
	switch e.kind {
	case jPartial:
		je = journal.Entry{Unit: "p:" + e.rel, Size: e.size}
	case jChunk:
		je = journal.Entry{Unit: "c:" + e.rel + "#" + strconv.Itoa(e.chunk), End: e.end, Commit: string(e.digest)}
	case jDone:
		je = journal.Entry{Unit: "f:" + e.rel, Commit: string(e.digest)}
	}
	h.jmu.Lock()
	defer h.jmu.Unlock()
	if h.jl == nil {
		return nil
	}
	return h.jl.Append(je)
}
