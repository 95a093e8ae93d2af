package mlxpack

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/inputerr"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
	"golang.org/x/sync/errgroup"
)

// Action is what a repack did to one destination entry; it marshals as
// its string.
type Action string

// Actions reported per destination entry.
const (
	ActionCreated   Action = "created"
	ActionReplaced  Action = "replaced"
	ActionUnchanged Action = "unchanged"
)

// EntryResult is what happened to one destination entry.
type EntryResult struct {
	Name   string    `json:"name"`
	Kind   EntryKind `json:"kind"`
	Target string    `json:"target,omitempty"` // link target as written
	Bytes  int64     `json:"bytes,omitempty"`  // new files only
	Action Action    `json:"action"`
}

// Result reports a repack.
type Result struct {
	Src           string         `json:"src"`
	Dst           string         `json:"dst"`
	Mode          string         `json:"mode"`
	ModelType     string         `json:"model_type"`
	Quantization  map[string]any `json:"quantization"`
	PackedModules int            `json:"packed_modules"`
	Entries       []EntryResult  `json:"entries"`
	Foreign       []string       `json:"foreign,omitempty"` // left in place under --force
	Removed       []string       `json:"removed,omitempty"` // stale links to source files that are gone
	Changed       bool           `json:"changed"`
	NewBytes      int64          `json:"new_bytes"` // bytes of new files (config, rewritten shards, index)
}

// Repack executes plan into dst. A dst that does not exist appears
// complete or not at all (built in a sibling temp directory, then
// renamed). An existing dst must be empty or an earlier repack of the same
// plan (only the names the plan makes, links where links go), unless
// Options.Force; stale links, shards and the config are replaced
// atomically, and entries already right are not touched, so a re-run
// changes nothing.
func Repack(ctx context.Context, plan *Plan, dst string) (*Result, error) {
	abs, err := filepath.Abs(dst)
	if err != nil {
		return nil, err
	}
	if err := checkNotNested(plan.Src, abs); err != nil {
		return nil, err
	}
	res := &Result{Src: plan.Src, Dst: abs, Mode: plan.Mode, ModelType: plan.ModelType, Quantization: plan.Quantization, PackedModules: len(plan.Modules)}
	st, err := os.Lstat(abs)
	if err == nil && st.Mode()&os.ModeSymlink != 0 {
		st, err = os.Stat(abs) // a link to a directory is that directory
		if errors.Is(err, os.ErrNotExist) {
			return nil, errf(abs, "", ErrDestination, "a dangling symlink")
		}
	}
	switch {
	case errors.Is(err, os.ErrNotExist):
		return res, repackFresh(ctx, plan, abs, res)
	case err != nil:
		return nil, err
	case !st.IsDir():
		return nil, errf(abs, "", ErrDestination, "exists and is not a directory")
	}
	if err := checkExisting(plan, abs, res); err != nil {
		return nil, err
	}
	return res, writeEntries(ctx, plan, abs, abs, res)
}

// checkNotNested refuses a destination that is the source, inside it, or
// holds it (fsutil.CheckApart, the rule every command follows): inputs are
// never modified.
func checkNotNested(src, dst string) error {
	err := fsutil.CheckApart(dst, true, src)
	var ie *inputerr.Error
	if errors.As(err, &ie) {
		return &Error{Path: dst, Err: fmt.Errorf("%w: %w", ErrDestinationInside, ie.Err)}
	}
	return err
}

// repackFresh builds dst as a sibling temp directory and renames it into
// place.
func repackFresh(ctx context.Context, plan *Plan, dst string, res *Result) (err error) {
	parent := filepath.Dir(dst)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dst)+".*"+fsutil.PartialSuffix)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	if err := writeEntries(ctx, plan, tmp, dst, res); err != nil {
		return err
	}
	return commitDir(tmp, dst)
}

// commitDir makes the directory built in tmp appear as dst, whole: tmp's
// entries are made durable, then it is renamed and the parent synced.
// Repack and Quantize both end this way.
func commitDir(tmp, dst string) error {
	if err := fsutil.SyncDir(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	return fsutil.SyncDir(filepath.Dir(dst))
}

// checkExisting decides whether dst may be written: every entry must be a
// name the plan makes (a link where a link goes), or the user said --force.
// Leftover temp files of an interrupted run are removed.
func checkExisting(plan *Plan, dst string, res *Result) error {
	ents, err := os.ReadDir(dst)
	if err != nil {
		return err
	}
	planned := map[string]Entry{}
	for _, e := range plan.Entries {
		planned[e.Name] = e
	}
	var leftovers []string
	for _, e := range ents {
		name := e.Name()
		if isLeftover(name, planned) {
			leftovers = append(leftovers, name)
			continue
		}
		pe, ours := planned[name]
		fi, err := os.Lstat(filepath.Join(dst, name))
		if err != nil {
			return err
		}
		isLink := fi.Mode()&os.ModeSymlink != 0
		if !ours && isLink && linksIntoSource(plan.Src, dst, name) {
			// A link an earlier repack made to a source file that has
			// since gone: stale, removed.
			leftovers = append(leftovers, name)
			res.Removed = append(res.Removed, name)
			continue
		}
		switch {
		case ours && pe.Kind == EntryLink && (isLink || plan.Opts.Force) && !fi.IsDir():
		case ours && pe.Kind != EntryLink && (isLink || fi.Mode().IsRegular()):
		case ours:
			return errf(filepath.Join(dst, name), "", ErrDestination, "a %s where repack puts a %s (use --force to replace files repack did not make)", kindOf(fi), pe.Kind)
		case !plan.Opts.Force:
			return errf(dst, "", ErrDestination, "it holds %s, which this repack does not make; use an empty or new directory, or --force to leave such files in place", name)
		case isWeightFile(name):
			return errf(filepath.Join(dst, name), "", ErrDestination, "mlx-lm would load this file with the repacked weights; not even --force leaves it in place")
		default:
			res.Foreign = append(res.Foreign, name)
		}
	}
	for _, name := range leftovers {
		if err := os.RemoveAll(filepath.Join(dst, name)); err != nil {
			return err
		}
	}
	if len(res.Removed) > 0 {
		res.Changed = true
	}
	return nil
}

// linksIntoSource reports whether dst/name is a symlink whose target names
// an entry directly inside src (the given path or the resolved one), as the
// links repack writes do.
func linksIntoSource(src, dst, name string) bool {
	target, err := os.Readlink(filepath.Join(dst, name))
	if err != nil {
		return false
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(fsutil.ResolveExisting(dst), target)
	}
	dir := filepath.Dir(filepath.Clean(target))
	if dir == src {
		return true
	}
	rs, err := filepath.EvalSymlinks(src)
	return err == nil && dir == rs
}

func kindOf(fi os.FileInfo) string {
	switch {
	case fi.IsDir():
		return "directory"
	case fi.Mode().IsRegular():
		return "regular file"
	case fi.Mode()&os.ModeSymlink != 0:
		return "symlink"
	}
	return "special file"
}

// isLeftover matches the temp names fsutil.CreateAtomic and link
// replacement use for planned names: ".<name>.<random>.partial".
func isLeftover(name string, planned map[string]Entry) bool {
	if !strings.HasPrefix(name, ".") || !strings.HasSuffix(name, fsutil.PartialSuffix) {
		return false
	}
	body := strings.TrimSuffix(name[1:], fsutil.PartialSuffix)
	i := strings.LastIndexByte(body, '.')
	if i < 0 {
		return false
	}
	_, ok := planned[body[:i]]
	return ok
}

func isWeightFile(name string) bool {
	return (strings.HasPrefix(name, "model") && strings.HasSuffix(name, ".safetensors")) || name == safetensors.IndexName
}

// writeEntries writes every planned entry into dir, whose final location
// is final (link targets are relative to it). Order: rewritten shards
// (up to Options.Jobs at once), links, index, config last (the commit
// point). Results are in plan order whatever the worker count.
func writeEntries(ctx context.Context, plan *Plan, dir, final string, res *Result) error {
	byName := map[string]*shardPlan{}
	for i := range plan.shards {
		byName[plan.shards[i].name] = &plan.shards[i]
	}
	results := make([]EntryResult, len(plan.Entries))
	one := func(ctx context.Context, i int) error {
		e := plan.Entries[i]
		if err := ctx.Err(); err != nil {
			return err
		}
		path := filepath.Join(dir, e.Name)
		r := EntryResult{Name: e.Name, Kind: e.Kind}
		var err error
		switch e.Kind {
		case EntryLink:
			r.Target, err = linkTarget(plan, e.Source, final)
			if err == nil {
				r.Action, err = placeLink(path, r.Target)
			}
		case EntryShard:
			r.Bytes, r.Action, err = placeShard(ctx, path, byName[e.Name])
			if err == nil && plan.Opts.Progress != nil {
				plan.Opts.Progress(r.Bytes)
			}
		case EntryIndex:
			r.Bytes, r.Action, err = placeBytes(path, plan.index)
		case EntryConfig:
			r.Bytes, r.Action, err = placeBytes(path, plan.config)
		}
		results[i] = r
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(1, plan.Opts.Jobs))
	for i, e := range plan.Entries {
		if e.Kind == EntryShard {
			g.Go(func() error { return one(gctx, i) })
		}
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for _, kind := range []EntryKind{EntryLink, EntryIndex, EntryConfig} {
		for i, e := range plan.Entries {
			if e.Kind == kind {
				if err := one(ctx, i); err != nil {
					return err
				}
			}
		}
	}
	for i, r := range results {
		if r.Action != ActionUnchanged {
			res.Changed = true
		}
		if plan.Entries[i].Kind != EntryLink {
			res.NewBytes += r.Bytes
		}
	}
	res.Entries = append(res.Entries, results...)
	return fsutil.SyncDir(dir)
}

func linkTarget(plan *Plan, source, final string) (string, error) {
	if !plan.Opts.Relative {
		return source, nil
	}
	// Relative to where the link will live, through resolved directories
	// so that a symlinked parent does not break the path.
	from := fsutil.ResolveExisting(final)
	to, err := filepath.EvalSymlinks(plan.Src)
	if err != nil {
		return "", err
	}
	return filepath.Rel(from, filepath.Join(to, filepath.Base(source)))
}

// placeLink makes path a symlink to target, replacing whatever is there
// atomically (new link under a temp name, renamed over).
func placeLink(path, target string) (Action, error) {
	action := ActionCreated
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSymlink != 0 {
			if cur, err := os.Readlink(path); err == nil && cur == target {
				return ActionUnchanged, nil
			}
		}
		action = ActionReplaced
	}
	dir, base := filepath.Split(path)
	for i := 0; ; i++ {
		tmp := filepath.Join(dir, fmt.Sprintf(".%s.%d%s", base, os.Getpid()+i, fsutil.PartialSuffix))
		err := os.Symlink(target, tmp)
		if errors.Is(err, os.ErrExist) && i < 100 {
			continue
		}
		if err != nil {
			return "", err
		}
		if err := os.Rename(tmp, path); err != nil {
			os.Remove(tmp)
			return "", err
		}
		return action, nil
	}
}

// placeBytes writes data to path atomically unless path already holds
// exactly data (then nothing is touched).
func placeBytes(path string, data []byte) (int64, Action, error) {
	action := ActionCreated
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().IsRegular() && fi.Size() == int64(len(data)) {
			if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
				return int64(len(data)), ActionUnchanged, nil
			}
		}
		action = ActionReplaced
	}
	if err := fsutil.WriteFileAtomic(path, data, 0o644); err != nil {
		return 0, "", err
	}
	return int64(len(data)), action, nil
}

// RewriteBytes is the size of the shards the repack writes (0 when it
// only links).
func (p *Plan) RewriteBytes() int64 {
	return total(p.shards, func(s shardPlan) int64 { return s.size })
}

// placeShard writes a rewritten shard unless path already holds exactly
// its bytes (compared streaming, without writing): under a temp name,
// renamed over path once complete and durable.
func placeShard(ctx context.Context, path string, s *shardPlan) (int64, Action, error) {
	fill := func(w io.Writer) error { return writeBody(ctx, w, s) }
	action := ActionCreated
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().IsRegular() {
			same, err := holdsShard(path, &s.outShard, fill)
			if err != nil {
				return 0, "", err
			}
			if same {
				return s.size, ActionUnchanged, nil
			}
		}
		action = ActionReplaced
	}
	w, err := replaceShard(path, &s.outShard)
	if err != nil {
		return 0, "", err
	}
	bw := bufio.NewWriterSize(w, chunk)
	err = fill(bw)
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		w.Abort()
		return 0, "", err
	}
	if err := w.Close(); err != nil {
		return 0, "", err
	}
	return s.size, action, nil
}

// chunk is the streaming unit: tensors are copied or transformed this many
// bytes at a time, never held whole.
const chunk = 1 << 20

// scratch is writeBody's working memory, fixed whatever the tensor sizes.
type scratch struct {
	buf        []byte
	vals, back []float32
}

// writeBody streams the shard's tensor bodies, in order, to w.
func writeBody(ctx context.Context, w io.Writer, s *shardPlan) error {
	buf := make([]byte, chunk)
	sc := &scratch{buf: buf}
	for _, t := range s.tensors {
		if err := ctx.Err(); err != nil {
			return err
		}
		// A stacked tensor is its parts one after another (expert after
		// expert), each streamed in chunks.
		for _, from := range t.sources() {
			sec := from.Section()
			if t.bias == 0 {
				if _, err := io.CopyBuffer(w, io.LimitReader(sec, sec.Size()), buf); err != nil {
					return fmt.Errorf("%s: tensor %q: %w", from.Shard.Path, from.Info.Name, err)
				}
				continue
			}
			if err := writeBiases(ctx, w, sec, from, t, sc); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeBiases writes biases = −2^(bits−1)·scales in the scale dtype. A
// power-of-two multiple is exact in BF16, F16 and F32 unless it overflows,
// which is reported rather than written as infinity.
func writeBiases(ctx context.Context, w io.Writer, sec *io.SectionReader, from safetensors.Location, t outTensor, sc *scratch) error {
	dt := t.spec.DType
	width := dt.Bits() / 8
	factor := -float32(math.Ldexp(1, t.bias-1))
	buf := sc.buf
	n := len(buf) / width * width
	if len(sc.vals) < n/width {
		sc.vals = make([]float32, n/width)
		sc.back = make([]float32, n/width)
	}
	vals := sc.vals
	var off int64
	for off < sec.Size() {
		if err := ctx.Err(); err != nil {
			return err
		}
		m := int(min(int64(n), sec.Size()-off))
		b := buf[:m]
		if _, err := sec.ReadAt(b, off); err != nil {
			return fmt.Errorf("%s: tensor %q: %w", from.Shard.Path, from.Info.Name, err)
		}
		v := vals[:m/width]
		if err := tensor.ToF32(dt, v, b); err != nil {
			return err
		}
		for i, s := range v {
			r := s * factor
			if math.IsInf(float64(r), 0) && !math.IsInf(float64(s), 0) {
				return errf(from.Shard.Path, from.Info.Name, ErrInconsistent, "scale %g at element %d: %g·scale overflows %s", s, (off/int64(width))+int64(i), factor, dt)
			}
			v[i] = r
		}
		if err := tensor.FromF32(dt, b, v); err != nil {
			return err
		}
		if dt == tensor.F16 || dt == tensor.BF16 {
			// The narrow cast must have been exact; check by round trip.
			back := sc.back[:len(v)]
			if err := tensor.ToF32(dt, back, b); err != nil {
				return err
			}
			for i := range v {
				if back[i] != v[i] && !(math.IsNaN(float64(back[i])) && math.IsNaN(float64(v[i]))) {
					return errf(from.Shard.Path, from.Info.Name, ErrInconsistent, "element %d: %g·scale is not exact in %s", (off/int64(width))+int64(i), factor, dt)
				}
			}
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
		off += int64(m)
	}
	return nil
}
