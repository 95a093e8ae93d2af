package quantize

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/internal/fsutil"
	"golang.org/x/sync/errgroup"
)

// Output is one file of a run: a plan of the run's input and where it
// goes.
type Output struct {
	Plan *Plan
	Path string
	// Journal is the resume journal's path (default Path + ".journal").
	Journal string
}

// RunMulti makes every output from one read of the input f: each row
// block of each source tensor is read and decoded once, then encoded for
// every output that needs it and written to each output's Path.partial.
// Every output has its own journal (Run's lifecycle, output by output):
// a killed run resumes each from the tensors durable in it, and each
// output's bytes are those a Run of its plan alone writes, whatever the
// worker count. The free space for all of them is checked first. The
// plans must be of f (one tensor list in one order).
//
// The results are in the order of outs, also on failure (each with its
// Leftover). With RunOptions.Errors each result lists the error of every
// tensor, measured against the values read as the blocks are made.
func RunMulti(ctx context.Context, f *gguf.File, outs []Output, o RunOptions) ([]*RunResult, error) {
	if len(outs) == 0 {
		return nil, errors.New("quantize: no outputs")
	}
	if err := sameInput(outs); err != nil {
		return nil, err
	}
	if err := checkSpaceAll(outs); err != nil {
		return nil, err
	}
	js := make([]*gguf.TensorJournal, len(outs))
	res := make([]*RunResult, len(outs))
	for k, out := range outs {
		jpath := out.Journal
		if jpath == "" {
			jpath = out.Path + ".journal"
		}
		j, err := gguf.OpenTensorJournalFiles(jpath, out.Plan.Layout.Files(out.Path), Stamp(f, out.Plan), o.NoSync)
		if err != nil {
			for _, j := range js[:k] {
				j.Close()
			}
			return nil, err
		}
		if o.JournalEvery > 0 {
			j.Every = o.JournalEvery
		}
		js[k] = j
		res[k] = &RunResult{Size: out.Plan.Layout.OutputSize(), Files: out.Plan.Layout.Files(out.Path)}
	}
	if err := writeMulti(ctx, f, outs, o, js, res); err != nil {
		for k, j := range js {
			res[k].Leftover = j.Abandon()
		}
		return res, err
	}
	var err error
	for _, j := range js {
		err = errors.Join(err, j.Remove())
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

// sameInput checks that every plan reads the same tensors in the same
// order (plans of one file always do).
func sameInput(outs []Output) error {
	first := outs[0].Plan
	for _, out := range outs[1:] {
		p := out.Plan
		if p.Input != first.Input || len(p.Tensors) != len(first.Tensors) {
			return fmt.Errorf("quantize: internal error: the plans of %s and %s are not of one input", out.Path, outs[0].Path)
		}
		for i := range p.Tensors {
			a, b := &p.Tensors[i], &first.Tensors[i]
			if a.Name != b.Name || a.In.Offset != b.In.Offset || a.InType != b.InType {
				return fmt.Errorf("quantize: internal error: tensor %d is %q in the plan of %s, %q in that of %s", i, a.Name, out.Path, b.Name, outs[0].Path)
			}
		}
	}
	seen := map[string]bool{}
	for _, out := range outs {
		abs, _ := filepath.Abs(out.Path)
		if seen[abs] {
			return fmt.Errorf("quantize: %s is the output of two types", out.Path)
		}
		seen[abs] = true
	}
	return nil
}

// checkSpaceAll refuses, before anything is written, outputs their file
// systems have no room for: the outputs of one directory together
// (counting what partial files of an interrupted run already hold).
func checkSpaceAll(outs []Output) error {
	need := map[string]int64{}
	var dirs []string
	for _, out := range outs {
		d := filepath.Dir(out.Path)
		if _, ok := need[d]; !ok {
			dirs = append(dirs, d)
		}
		need[d] += spaceNeeded(out.Path, out.Plan.Layout)
	}
	for _, d := range dirs {
		free, ok, err := fsutil.FreeSpace(d)
		if err != nil || !ok {
			continue // unknown here: reserving the file still fails early
		}
		if free < need[d] {
			return fmt.Errorf("%s: %w: the outputs there need %d bytes, %d are free", d, ErrNoSpace, need[d], free)
		}
	}
	return nil
}

func writeMulti(ctx context.Context, f *gguf.File, outs []Output, o RunOptions, js []*gguf.TensorJournal, res []*RunResult) error {
	jobs := o.Jobs
	if jobs <= 0 {
		jobs = runtime.GOMAXPROCS(0)
	}
	chunk := o.ChunkElems
	if chunk <= 0 {
		chunk = 1 << 20
	}
	ws := make([]*gguf.Writer, len(outs))
	detach := func() {
		for _, w := range ws {
			if w != nil {
				w.Detach()
			}
		}
	}
	tensors := outs[0].Plan.Tensors
	writes := make([][]bool, len(outs)) // writes[k][i]: tensor i is not durable in output k
	for k, out := range outs {
		w, err := gguf.Create(out.Path, out.Plan.Layout, gguf.Options{Resume: true, NoSync: o.NoSync})
		if err != nil {
			detach()
			return err
		}
		ws[k] = w
		writes[k] = make([]bool, len(tensors))
		for i := range tensors {
			t := &out.Plan.Tensors[i]
			if w.Resumed() && js[k].Has(i, t.Name) {
				w.Skip(i)
				res[k].Resumed++
				continue
			}
			writes[k][i] = true
		}
	}
	var units []gguf.Unit
	for i := range tensors {
		t := &tensors[i]
		need := o.Errors // a resumed tensor's errors are measured again
		for k := range outs {
			need = need || writes[k][i]
		}
		if !need {
			if o.Progress != nil {
				o.Progress(t.In.Size())
			}
			continue
		}
		cols := int64(ne0(t.In.Dims))
		units = gguf.SplitRows(units, i, int64(t.In.NumElements())/max(cols, 1), chunk/max(cols, 1))
	}
	same := sameEncoding(outs)
	var errs *errorSums
	if o.Errors {
		errs = newErrorSums(len(units), len(outs))
	}
	hfs, err := followers(ws, outs, units, writes, o.Digests)
	if err != nil {
		detach()
		return err
	}
	bufs := make([]buffers, jobs)
	err = gguf.WriteUnitsMulti(ctx, ws, units, gguf.MultiUnitWork{
		Jobs:   jobs,
		Cores:  o.Cores,
		Writes: func(k, i int) bool { return writes[k][i] },
		Make: func(worker, u int) ([][]byte, []int64, error) {
			unit := units[u]
			if unit.R0 == 0 && o.Tensor != nil {
				o.Tensor(unit.T, tensors[unit.T].Name)
			}
			return makeUnit(f, outs, writes, same, unit, errs.unit(u), &bufs[worker])
		},
		Written: func(worker, u int) {
			for _, hf := range hfs {
				hf.Written(u)
			}
			if o.Progress != nil {
				o.Progress(int64(len(bufs[worker].raw)))
			}
		},
		Also: func(ctx context.Context) error {
			if len(hfs) == 0 {
				return nil
			}
			g, gctx := errgroup.WithContext(ctx)
			for _, hf := range hfs {
				g.Go(func() error { return hf.Run(gctx) })
			}
			return g.Wait()
		},
		Done: func(k, i int) {
			js[k].Done(i, tensors[i].Name)
			if o.TensorDone != nil {
				o.TensorDone(i, tensors[i].Name)
			}
		},
	})
	if err != nil {
		detach()
		return err
	}
	for k, w := range ws {
		if err := w.Close(); err != nil {
			detach()
			return err
		}
		ws[k] = nil
	}
	if errs != nil {
		for k, out := range outs {
			res[k].Errors = errs.tensors(out.Plan, units, k)
		}
	}
	for k, hf := range hfs {
		res[k].Digests = hf.Sums()
	}
	return nil
}

// followers are the hash followers of the writers (RunOptions.Digests;
// none otherwise), one per output: unit u of output k begins at its
// tensor's start plus R0 output rows, and a unit whose tensor output k
// does not write (kept from an interrupted run) is in its file already.
func followers(ws []*gguf.Writer, outs []Output, units []gguf.Unit, writes [][]bool, digests bool) ([]*gguf.HashFollower, error) {
	if !digests {
		return nil, nil
	}
	hfs := make([]*gguf.HashFollower, len(ws))
	for k, w := range ws {
		start := make([]int64, len(units))
		for u, unit := range units {
			t := &outs[k].Plan.Tensors[unit.T]
			outRow, _ := t.Type.RowSize(ne0(t.In.Dims))
			start[u] = w.TensorStart(unit.T) + unit.R0*int64(outRow)
		}
		hf, err := gguf.NewHashFollower(w, start)
		if err != nil {
			return nil, err
		}
		for u, unit := range units {
			if !writes[k][unit.T] {
				hf.Written(u)
			}
		}
		hfs[k] = hf
	}
	return hfs, nil
}

// sameEncoding says, for each output k and tensor i, an earlier output
// whose tensor i is encoded the same way (the same type, importance
// vector and input), so its blocks serve both: -1 for none. Mixes share
// many tensors (Q4_K_M's Q6_K attn_v, ffn_down and output with Q6_K's,
// Q2_K's Q4_K ones with Q4_K_M's).
func sameEncoding(outs []Output) [][]int {
	same := make([][]int, len(outs))
	for k, out := range outs {
		same[k] = make([]int, len(out.Plan.Tensors))
		for i := range out.Plan.Tensors {
			t := &out.Plan.Tensors[i]
			same[k][i] = -1
			for j := range k {
				u := &outs[j].Plan.Tensors[i]
				if !t.Copy() && u.Type == t.Type && slices.Equal(u.Weights, t.Weights) && (u.Weights == nil) == (t.Weights == nil) {
					same[k][i] = j
					break
				}
			}
		}
	}
	return same
}

// makeUnit reads unit u of the input once and makes its bytes for every
// output that writes it (or whose errors are measured: sums non-nil),
// encoding the blocks an earlier output already made (same) only once.
func makeUnit(f *gguf.File, outs []Output, writes [][]bool, same [][]int, u gguf.Unit, sums []errorSum, b *buffers) ([][]byte, []int64, error) {
	n := len(outs)
	b.data, b.offs = grow(b.data, int64(n)), grow(b.offs, int64(n))
	if len(b.outs) < n {
		b.outs = slices.Grow(b.outs, n)[:n]
	}
	in := &outs[0].Plan.Tensors[u.T]
	if err := readRows(f, in, u, b); err != nil {
		return nil, nil, err
	}
	cols := ne0(in.In.Dims)
	decoded := false
	b.made = grow(b.made, int64(n))
	for k, out := range outs {
		t := &out.Plan.Tensors[u.T]
		b.data[k], b.made[k] = nil, false
		if !writes[k][u.T] && sums == nil {
			continue
		}
		outRow, _ := t.Type.RowSize(cols)
		b.offs[k] = u.R0 * int64(outRow)
		if t.Copy() {
			if writes[k][u.T] {
				b.data[k] = b.raw
			}
			if sums != nil {
				sums[k] = errorSum{n: (u.R1 - u.R0) * int64(cols)}
			}
			continue
		}
		if j := same[k][u.T]; j >= 0 && b.made[j] {
			// The blocks output j made: the same bytes, the same errors.
			b.outs[k] = append(b.outs[k][:0], b.outs[j]...)
			if sums != nil {
				sums[k] = sums[j]
			}
			b.made[k] = true
			if writes[k][u.T] {
				b.data[k] = b.outs[k]
			}
			continue
		}
		if !decoded {
			b.f32 = grow(b.f32, (u.R1-u.R0)*int64(cols))
			if err := decode(in.InType, b.f32, b.raw); err != nil {
				return nil, nil, fmt.Errorf("%s: tensor %q: %w", f.Path, in.Name, err)
			}
			decoded = true
		}
		b.outs[k] = grow(b.outs[k], (u.R1-u.R0)*int64(outRow))
		if err := encodeRows(f, t, u, b.outs[k], b.f32); err != nil {
			return nil, nil, err
		}
		if sums != nil {
			if err := sums[k].measure(t, u.R0, u.R1, b.outs[k], b.f32, &b.deq); err != nil {
				return nil, nil, fmt.Errorf("%s: tensor %q: %w", f.Path, t.Name, err)
			}
		}
		b.made[k] = true
		if writes[k][u.T] {
			b.data[k] = b.outs[k]
		}
	}
	return b.data, b.offs, nil
}
