package pipeline

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ferry-llm/ferry/gguf/convert"
	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/safetensors"
)

// ggufStage converts a safetensors checkpoint stage to one GGUF file with
// gguf/convert (convert_hf_to_gguf.py semantics).
//
//	gguf: { from: merged, outtype: f16, model_name: Jarvis2-27B, no_mtp: false, mtp_only: false, pre: qwen2 }
//
// outtype is f16 (default), bf16, f32, q8_0 or auto. Like
// convert_hf_to_gguf.py, general.name and friends come from the model
// directory's name; the stage converts from a directory named model_name
// (default: the from stage's name), so the output does not depend on where
// views live.
//
// Resume: the converter keeps <file>.partial in the stage's work dir; the
// stage records finished tensors in a done list, appended only after the
// partial file has been fsynced, so a killed run rewrites only tensors that
// were not durable.
type ggufStage struct {
	From      string `json:"from"`
	OutType   string `json:"outtype"`
	ModelName string `json:"model_name"`
	NoMTP     bool   `json:"no_mtp,omitempty"`
	MTPOnly   bool   `json:"mtp_only,omitempty"`
	Pre       string `json:"pre,omitempty"`
}

var _ Stage = (*ggufStage)(nil)

func newGGUF(p *Params) (Stage, error) {
	s := &ggufStage{}
	var err error
	if s.From, err = p.Ref("from", true); err != nil {
		return nil, err
	}
	if s.OutType, err = p.String("outtype", false); err != nil {
		return nil, err
	}
	s.OutType = strings.ToLower(s.OutType)
	switch convert.OutType(s.OutType) {
	case "":
		s.OutType = string(convert.OutF16)
	case convert.OutF16, convert.OutBF16, convert.OutF32, convert.OutQ8_0, convert.OutAuto:
	default:
		return nil, p.Errorf("outtype", "want f16, bf16, f32, q8_0 or auto, got %q", s.OutType)
	}
	if s.ModelName, err = p.String("model_name", false); err != nil {
		return nil, err
	}
	if s.ModelName == "" {
		s.ModelName = s.From
	}
	if strings.ContainsAny(s.ModelName, `/\`) || s.ModelName == "." || s.ModelName == ".." {
		return nil, p.Errorf("model_name", "must be a plain name, got %q", s.ModelName)
	}
	if s.NoMTP, err = p.Bool("no_mtp", false); err != nil {
		return nil, err
	}
	if s.MTPOnly, err = p.Bool("mtp_only", false); err != nil {
		return nil, err
	}
	if s.NoMTP && s.MTPOnly {
		return nil, p.Errorf("mtp_only", "no_mtp and mtp_only exclude each other")
	}
	if s.Pre, err = p.String("pre", false); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *ggufStage) Params() any { return s }

func (s *ggufStage) Run(ctx context.Context, env *Env) (*Result, error) {
	in := env.Input(s.From)
	if in == nil {
		return nil, fmt.Errorf("gguf: input %q not given", s.From)
	}
	work, err := env.WorkDir()
	if err != nil {
		return nil, err
	}
	src := filepath.Join(work, "src", s.ModelName)
	if err := env.Store.MakeView(src, in.Outputs); err != nil {
		return nil, err
	}
	ck, err := safetensors.OpenDir(src)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	plan, err := convert.NewPlan(ck, convert.Options{
		OutType: convert.OutType(s.OutType), NoMTP: s.NoMTP, MTPOnly: s.MTPOnly, Pre: s.Pre,
	})
	if err != nil {
		return nil, err
	}
	name := plan.DefaultFileName(s.MTPOnly)
	out := filepath.Join(work, name)
	env.Progress.SetTotal(plan.InputBytes)

	dl, err := openDoneList(filepath.Join(work, "tensors.done"), out+".partial")
	if err != nil {
		return nil, err
	}
	defer dl.close()
	if dl.complete(out) {
		// A run killed after the conversion finished: the file is whole.
		d, n, err := env.Store.Adopt(out)
		if err != nil {
			return nil, err
		}
		env.Progress.Add(plan.InputBytes)
		return &Result{Outputs: []manifest.Output{{Path: name, Digest: d, Size: n}}}, nil
	}
	var sum []byte
	err = convert.Write(ctx, plan, out, convert.WriteOptions{
		Jobs:   env.Jobs,
		Resume: true,
		Verify: func(i int, name string, _ *io.SectionReader) bool {
			return dl.has(i, name)
		},
		Progress:   env.Progress.Add,
		TensorDone: dl.add,
		Digest:     func(s []byte) { sum = s },
	})
	if err != nil {
		if ferr := dl.flush(); ferr != nil {
			env.Log.Warn("gguf: could not save the done list", "err", ferr)
		}
		return nil, err
	}
	// convert.Write fsynced and renamed the file; say so durably.
	if err := dl.markComplete(out); err != nil {
		return nil, err
	}
	// Hashed while it was written: adopt it without reading it again.
	d, n, err := env.Store.AdoptKnown(out, manifest.NewDigest(sum), plan.Layout.Size)
	if err != nil {
		return nil, err
	}
	return &Result{Outputs: []manifest.Output{{Path: name, Digest: d, Size: n}}}, nil
}

// doneList records the tensors of a partial GGUF whose bytes are durable:
// tensors reported done are kept pending until the partial file has been
// fsynced (at most once a second), then appended to the list and the list
// fsynced. A line is "index name".
type doneList struct {
	mu      sync.Mutex
	path    string
	partial string
	done    map[string]bool
	pending []string
	last    time.Time
	f       *os.File
}

const maxDoneList = 64 << 20

func openDoneList(path, partial string) (*doneList, error) {
	dl := &doneList{path: path, partial: partial, done: map[string]bool{}, last: time.Now()}
	_, perr := os.Stat(partial)
	_, oerr := os.Stat(strings.TrimSuffix(partial, ".partial"))
	if errors.Is(perr, fs.ErrNotExist) && errors.Is(oerr, fs.ErrNotExist) {
		os.Remove(path) // neither a partial nor a finished file: the list is stale
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(io.LimitReader(f, maxDoneList))
	for sc.Scan() {
		line := sc.Text()
		i, name, ok := strings.Cut(line, " ")
		if _, err := strconv.Atoi(i); ok && err == nil && name != "" || strings.HasPrefix(line, completeMark) {
			dl.done[line] = true
		}
	}
	dl.f = f
	return dl, nil
}

func (dl *doneList) has(i int, name string) bool {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	return dl.done[strconv.Itoa(i)+" "+name]
}

func (dl *doneList) add(i int, name string) {
	dl.mu.Lock()
	dl.pending = append(dl.pending, strconv.Itoa(i)+" "+name)
	due := time.Since(dl.last) > time.Second
	dl.mu.Unlock()
	if due {
		dl.flush()
	}
}

// flush fsyncs the partial file, then records the pending tensors.
func (dl *doneList) flush() error {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	dl.last = time.Now()
	if len(dl.pending) == 0 {
		return nil
	}
	pf, err := os.Open(dl.partial)
	if err != nil {
		return err
	}
	err = pf.Sync()
	pf.Close()
	if err != nil {
		return err
	}
	var b strings.Builder
	for _, l := range dl.pending {
		b.WriteString(l + "\n")
		dl.done[l] = true
	}
	if _, err := dl.f.WriteString(b.String()); err != nil {
		return err
	}
	dl.pending = dl.pending[:0]
	return dl.f.Sync()
}

func (dl *doneList) close() { dl.f.Close() }

const completeMark = "complete "

// markComplete records that out is finished (convert.Write has renamed it).
func (dl *doneList) markComplete(out string) error {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	line := completeMark + filepath.Base(out)
	if _, err := dl.f.WriteString(line + "\n"); err != nil {
		return err
	}
	dl.done[line] = true
	return dl.f.Sync()
}

// complete reports whether an earlier run finished out and it is still there.
func (dl *doneList) complete(out string) bool {
	dl.mu.Lock()
	ok := dl.done[completeMark+filepath.Base(out)]
	dl.mu.Unlock()
	if !ok {
		return false
	}
	_, err := os.Stat(out)
	return err == nil
}
