package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/jsonout"
	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/verify"
)

// ErrVerifyFailed is wrapped by a verification stage whose check failed
// (kind VerifyFailed: the CLI exits 3).
var ErrVerifyFailed = errkind.New(errkind.VerifyFailed, "verification failed")

// verifyMTPStage checks that the MTP head of every artifact of its from
// stages is really in the weight index (verify.MTP): each .gguf file a
// stage made, and every stage that made a safetensors or MLX directory.
//
//	verify_mtp: { from: [f16, quants, mlx4], require: true, deep: false }
//
// require makes an absent head a failure; deep reads the head's tensor
// bytes. The stage's output is the report (mtp-report.json: a
// verify.Summary, the layout `ferry verify mtp --json` prints, its results
// in artifact order); a failed check fails the stage (exit 3) and leaves no
// record, so it runs again next time.
type verifyMTPStage struct {
	From    []string `json:"from"`
	Require bool     `json:"require"`
	Deep    bool     `json:"deep,omitempty"`
}

var _ Stage = (*verifyMTPStage)(nil)

func newVerifyMTP(p *Params) (Stage, error) {
	s := &verifyMTPStage{}
	var err error
	if s.From, err = p.Refs("from", true); err != nil {
		return nil, err
	}
	if s.Require, err = p.Bool("require", false); err != nil {
		return nil, err
	}
	if s.Deep, err = p.Bool("deep", false); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *verifyMTPStage) Params() any { return s }

func (s *verifyMTPStage) Run(ctx context.Context, env *Env) (*Result, error) {
	opts := verify.Options{Deep: s.Deep, Require: s.Require}
	var results []verify.Result
	var failed []string
	for _, name := range s.From {
		in := env.Input(name)
		if in == nil {
			return nil, fmt.Errorf("verify_mtp: input %q not given", name)
		}
		var targets [][2]string // artifact name, path
		for _, o := range in.Outputs {
			// A split is checked through its first part, which reads them all.
			if strings.HasSuffix(strings.ToLower(o.Path), ".gguf") && !laterSplitPart(o.Path) {
				targets = append(targets, [2]string{name + "/" + o.Path, filepath.Join(in.Dir, filepath.FromSlash(o.Path))})
			}
		}
		if len(targets) == 0 {
			targets = append(targets, [2]string{name, in.Dir})
		}
		for _, t := range targets {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			// Named by artifact: the report must not depend on where views live.
			r, err := verify.Check(t[0], t[1], opts)
			if err != nil {
				return nil, fmt.Errorf("verify_mtp %s: %w", t[0], err)
			}
			results = append(results, r)
			env.Log.Info("mtp check", "artifact", t[0], "verdict", r.Verdict, "pass", r.Pass)
			if !r.Pass {
				failed = append(failed, fmt.Sprintf("%s: %s (%s)", t[0], r.Verdict, r.Message))
			}
		}
	}
	sort.SliceStable(results, func(i, j int) bool { return results[i].Path < results[j].Path })
	if len(failed) > 0 {
		return nil, fmt.Errorf("%w: MTP head: %s", ErrVerifyFailed, strings.Join(failed, "; "))
	}
	var buf bytes.Buffer
	if err := jsonout.Write(&buf, verify.Summarize(opts, results)); err != nil {
		return nil, err
	}
	d, n, err := env.Ingest(&buf, int64(buf.Len()))
	if err != nil {
		return nil, err
	}
	return &Result{Outputs: []manifest.Output{{Path: path.Clean("mtp-report.json"), Digest: d, Size: n}}}, nil
}
