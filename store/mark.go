package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Marks. A lease is named by what it makes (a stage's key), which a
// machine works out from that thing's inputs. A machine that cannot (the
// stage's inputs are files it does not have) looks for it by a name it
// can work out, a group (the stage's ref): a mark says "lease L, live,
// makes something of group G". It is the object marks/<G>/<hash of L>,
// written by L's holder after it took L (Lease.Mark) and removed by its
// Release before the release is written (so that a machine that sees the
// lease released and no mark finds what the holder made, its ref already
// pointed). Marked lists a group's marks whose leases are live. A mark
// that a holder which died left is ignored once its lease has ended,
// replaced by the mark of that lease's next holder, and removed by gc
// past the grace period.

// Mark is one live lease of a group, as Marked finds it.
type Mark struct {
	Lease  string    // the lease's name
	Holder string    // the machine holding it now
	Until  time.Time // when it ends unless renewed, on this machine's clock
	// Note is what the holder said it is making (JSON).
	Note json.RawMessage
}

// markBody is a mark object's content.
type markBody struct {
	Lease  string `json:"lease"`
	Holder string `json:"holder"` // the machine that wrote it
	// ID is the acquisition of the lease that wrote it (LeaseInfo.ID):
	// a mark counts only while that acquisition holds the lease, and two
	// acquisitions' marks never have the same bytes (nor ETag).
	ID   string          `json:"id"`
	Note json.RawMessage `json:"note,omitempty"`
}

// maxMarkBytes bounds a mark object (its note, a stage's parameters).
const maxMarkBytes = 256 << 10

const markPrefix = "marks/"

// markKey is the object of the mark of lease in group: a hash of the
// lease's name, so that a group's marks are the objects right under its
// prefix (a group named like another plus a lease's name cannot mix).
func markKey(group, lease string) string {
	h := sha256.Sum256([]byte(lease))
	return markPrefix + group + "/" + hex.EncodeToString(h[:16])
}

// markAt is a mark the holder wrote, and the version it wrote.
type markAt struct {
	key, etag string
}

// Mark writes the mark of l in group, with note (JSON: what l makes), in
// place of one another holder of l left there. Release removes it.
func (l *Lease) Mark(ctx context.Context, group string, note json.RawMessage) error {
	if err := checkName("mark group", group); err != nil {
		return err
	}
	if note != nil && !json.Valid(note) {
		return fmt.Errorf("store: mark of lease %s in %s: the note is not JSON", l.name, group)
	}
	l.wmu.Lock()
	id := l.info.ID
	l.wmu.Unlock()
	body, err := json.Marshal(markBody{Lease: l.name, Holder: l.s.opt.Host, ID: id, Note: note})
	if err != nil {
		return err
	}
	if len(body) > maxMarkBytes {
		return fmt.Errorf("store: mark of lease %s in %s: %d bytes, more than %d", l.name, group, len(body), maxMarkBytes)
	}
	key := markKey(group, l.name)
	in, err := l.s.b.Put(ctx, key, body, PutOptions{})
	if err != nil {
		return fmt.Errorf("%s: mark of lease %s in %s: %w", l.s.b, l.name, group, err)
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	for i, m := range l.marks {
		if m.key == key {
			l.marks[i].etag = in.ETag
			return nil
		}
	}
	l.marks = append(l.marks, markAt{key, in.ETag})
	return nil
}

// Unmark removes the mark of l in group (one Mark wrote), if it is still
// the version l wrote, while l is held: l no longer makes anything of
// group (a lease marking several groups, done with one of them).
func (l *Lease) Unmark(ctx context.Context, group string) error {
	if err := checkName("mark group", group); err != nil {
		return err
	}
	key := markKey(group, l.name)
	l.wmu.Lock()
	var m *markAt
	for i := range l.marks {
		if l.marks[i].key == key {
			m = &markAt{key, l.marks[i].etag}
			l.marks = append(l.marks[:i:i], l.marks[i+1:]...)
			break
		}
	}
	l.wmu.Unlock()
	if m == nil {
		return nil
	}
	etag := m.etag
	if l.s.probe != nil && !l.s.probe.ConditionalDelete {
		etag = ""
	}
	if err := l.s.b.Delete(ctx, key, etag); err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("%s: mark of lease %s in %s: %w", l.s.b, l.name, group, err)
	}
	return nil
}

// unmark removes the marks l wrote, each only if it is still the version
// l wrote: best effort, as a mark left behind is ignored once l has
// ended.
func (l *Lease) unmark(ctx context.Context) {
	l.wmu.Lock()
	marks := l.marks
	l.marks = nil
	l.wmu.Unlock()
	// Where the storage does not take conditional deletes, whole ones:
	// l still holds the lease, and a mark names its acquisition.
	cond := l.s.probe == nil || l.s.probe.ConditionalDelete
	for _, m := range marks {
		etag := m.etag
		if !cond {
			etag = ""
		}
		l.s.b.Delete(ctx, m.key, etag)
	}
}

// Marked is the marks of group whose leases are live (neither released
// nor expired by the storage's clock) and held by the acquisition that
// wrote them, in the order of the leases' names.
func (s *Store) Marked(ctx context.Context, group string) ([]Mark, error) {
	if err := checkName("mark group", group); err != nil {
		return nil, err
	}
	prefix := markPrefix + group + "/"
	var keys []string
	if err := s.b.List(ctx, prefix, func(in Info) error {
		if rest := strings.TrimPrefix(in.Key, prefix); !strings.Contains(rest, "/") {
			keys = append(keys, in.Key)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	var marks []Mark
	for _, k := range keys {
		body, _, err := s.b.Get(ctx, k, maxMarkBytes)
		if errors.Is(err, ErrNotFound) || errors.Is(err, ErrTooLarge) {
			continue // removed since the listing; or no mark (gc removes it)
		}
		if err != nil {
			return nil, err
		}
		var mb markBody
		if json.Unmarshal(body, &mb) != nil || checkName("lease", mb.Lease) != nil || markKey(group, mb.Lease) != k {
			continue // not a mark this store wrote: gc removes it
		}
		li, until, live, err := s.LeaseStatus(ctx, mb.Lease)
		if errors.Is(err, ErrNotFound) || err == nil && (!live || li.ID != mb.ID) {
			// Ended; or taken since by another acquisition, which marks
			// it again if it makes something of this group.
			continue
		}
		if err != nil {
			return nil, err
		}
		marks = append(marks, Mark{Lease: mb.Lease, Holder: li.Holder, Until: until, Note: mb.Note})
	}
	sort.Slice(marks, func(i, j int) bool { return marks[i].Lease < marks[j].Lease })
	return marks, nil
}

// removeOldMarks deletes the marks older than the grace period whose
// leases are not live (released, expired, gone, or held by another
// acquisition since), or that do not parse:
// each by a delete conditional on the version read, so that a mark its
// lease's next holder wrote meanwhile stays. Storage that ignores
// conditional deletes keeps them (Marked ignores them).
func (s *Store) removeOldMarks(ctx context.Context, opt GCOptions, rep *GCReport) error {
	if !opt.DryRun && (s.probe == nil || !s.probe.ConditionalDelete) {
		return nil
	}
	var keys []string
	if err := s.b.List(ctx, markPrefix, func(in Info) error {
		keys = append(keys, in.Key)
		return nil
	}); err != nil {
		return err
	}
	for _, k := range keys {
		body, in, err := s.b.Get(ctx, k, maxMarkBytes)
		switch {
		case errors.Is(err, ErrNotFound):
			continue
		case errors.Is(err, ErrTooLarge):
			// Not one of ours by its size: judged by its age alone.
			if in, err = s.b.Head(ctx, k); errors.Is(err, ErrNotFound) {
				continue
			} else if err != nil {
				return err
			}
		case err != nil:
			return err
		}
		if in.Date.IsZero() || in.Date.Sub(in.Modified) < opt.Grace {
			continue
		}
		var mb markBody
		if body != nil && json.Unmarshal(body, &mb) == nil && checkName("lease", mb.Lease) == nil {
			li, _, live, err := s.LeaseStatus(ctx, mb.Lease)
			if err != nil && !errors.Is(err, ErrNotFound) {
				return err
			}
			if live && li.ID == mb.ID {
				continue
			}
		}
		if !opt.DryRun {
			err := s.b.Delete(ctx, k, in.ETag)
			if errors.Is(err, ErrPrecondition) || errors.Is(err, ErrNotFound) {
				continue // written again meanwhile
			}
			if err != nil {
				return err
			}
		}
		rep.RemovedMarks++
	}
	return nil
}
