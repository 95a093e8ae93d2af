package transfer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/journal"
)

// The resume journal of one destination (internal/journal, in
// Options.StateDir, named by a digest of the destination): its ref is a
// digest of the plan (chunk size, every file's path, size and digest), so
// a changed source starts it over. Its lines, one type each:
//
//	{"unit":"p:REL","size":N}                     REL.partial (re)created with N bytes (-1: dropped)
//	{"unit":"c:REL#I","end":E,"commit":"sha256:…"} chunk I (ending at E) written and fsynced there
//	{"unit":"f:REL","commit":"sha256:…","stamp":{"size":N,"mtime_ns":T}}  REL verified and in place, with that mtime
//
// A chunk line is appended only after the remote server acknowledged
// every write of the chunk and its fsync@openssh.com; a new partial line
// drops the chunk lines before it, and is appended before the partial is
// created or truncated (a partial line whose file is missing or of
// another size only makes the next run create it again). The digest of
// each chunk is what the final check compares read-back chunks with, so
// a file that fails verification gets only its bad chunks again. Files of
// one chunk keep no partial or chunk lines: a run that stops before they
// are verified sends them again whole.

// jPartial, jChunk and jDone are the journal's line types.
type jPartial struct {
	rel  string
	size int64 // -1: dropped
}

type jChunk struct {
	rel    string
	chunk  int
	end    int64
	digest digest.Digest
}

type jDone struct {
	rel    string
	digest digest.Digest
	size   int64
	mtime  int64 // unix seconds the destination lists for it (0: unknown)
}

// jLine is one of the line types.
type jLine interface{ entry() journal.Entry }

func (e jPartial) entry() journal.Entry { return journal.Entry{Unit: "p:" + e.rel, Size: e.size} }

func (e jChunk) entry() journal.Entry {
	return journal.Entry{Unit: "c:" + e.rel + "#" + strconv.Itoa(e.chunk), End: e.end, Commit: string(e.digest)}
}

func (e jDone) entry() journal.Entry {
	st, _ := json.Marshal(fsutil.Stamp{Size: e.size, MtimeNs: e.mtime * 1e9})
	return journal.Entry{Unit: "f:" + e.rel, Commit: string(e.digest), Stamp: st}
}

// parseLine reads one journal entry back into its type (nil: not one of
// ours, skipped).
func parseLine(e journal.Entry) jLine {
	kind, rest, ok := strings.Cut(e.Unit, ":")
	if !ok {
		return nil
	}
	switch kind {
	case "p":
		return jPartial{rel: rest, size: e.Size}
	case "c":
		rel, idx, ok := strings.Cut(rest, "#")
		i, err := strconv.Atoi(idx)
		d, derr := digest.Parse(e.Commit)
		if !ok || err != nil || derr != nil || i < 0 {
			return nil
		}
		return jChunk{rel: rel, chunk: i, end: e.End, digest: d}
	case "f":
		d, err := digest.Parse(e.Commit)
		if err != nil {
			return nil
		}
		var st fsutil.Stamp
		if len(e.Stamp) > 0 && json.Unmarshal(e.Stamp, &st) != nil {
			return nil
		}
		return jDone{rel: rest, digest: d, size: st.Size, mtime: st.MtimeNs / 1e9}
	}
	return nil
}

// journalRef is the plan's identity for the journal: its files' digests,
// or, for a plan whose files are hashed as they are sent (HashLater),
// their stamps (the journal stays on this machine; the chunks it keeps
// are checked against the source's bytes again before a file is renamed
// into place).
func journalRef(p *Plan, dest string) string {
	h := sha256.New()
	if p.later != nil {
		fmt.Fprintf(h, "ferry transfer 2 stamps\x00%s\x00%d\x00", dest, p.ChunkSize)
		for _, f := range p.Files {
			fmt.Fprintf(h, "%s\x00%d\x00%d\x00%d\x00", f.Rel, f.Stamp.Size, f.Stamp.MtimeNs, f.Stamp.Inode)
		}
		return "transfer:" + hex.EncodeToString(h.Sum(nil))
	}
	fmt.Fprintf(h, "ferry transfer 2\x00%s\x00%d\x00", dest, p.ChunkSize)
	for _, f := range p.Files {
		if f.src != nil {
			// The version read (its digest may be learnt only by reading it).
			fmt.Fprintf(h, "%s\x00%d\x00%s\x00", f.Rel, f.Size, f.src.ident())
			continue
		}
		fmt.Fprintf(h, "%s\x00%d\x00%s\x00", f.Rel, f.Size, f.Digest)
	}
	return "transfer:" + hex.EncodeToString(h.Sum(nil))
}

// JournalPath is where the journal of destination dest lives in stateDir.
func JournalPath(stateDir, dest string) string {
	s := sha256.Sum256([]byte(dest))
	return filepath.Join(stateDir, "transfer-"+hex.EncodeToString(s[:8])+".journal")
}

// fileState is what the journal says about one file at one destination.
type fileState struct {
	partial int64 // size the partial was created with; -1: none
	chunks  map[int]digest.Digest
	done    *jDone // verified and renamed into place
}

func (h *host) openJournal() error {
	jl, entries, _, err := journal.Open(JournalPath(h.o.StateDir, h.d.Name), journalRef(h.p, h.d.Name))
	if err != nil {
		return err
	}
	h.jl = jl
	for _, e := range entries {
		switch l := parseLine(e).(type) {
		case jPartial:
			st := h.stateOf(l.rel)
			st.partial, st.chunks = l.size, map[int]digest.Digest{}
		case jChunk:
			h.stateOf(l.rel).chunks[l.chunk] = l.digest
		case jDone:
			h.stateOf(l.rel).done = &l
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

// journal appends l, fsynced.
func (h *host) journal(l jLine) error {
	h.jmu.Lock()
	defer h.jmu.Unlock()
	if h.jl == nil {
		return nil
	}
	return h.jl.Append(l.entry())
}

// journalNoSync appends l without fsyncing it; syncJournal makes it
// durable with the lines before it. A file verified and renamed into
// place is only saved work, not a claim a later run trusts without the
// destination's listing agreeing.
func (h *host) journalNoSync(l jLine) error {
	h.jmu.Lock()
	defer h.jmu.Unlock()
	if h.jl == nil {
		return nil
	}
	return h.jl.AppendNoSync(l.entry())
}

func (h *host) syncJournal() error {
	h.jmu.Lock()
	defer h.jmu.Unlock()
	if h.jl == nil {
		return nil
	}
	return h.jl.Append()
}
