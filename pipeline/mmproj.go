package pipeline

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/ferry-llm/ferry/gguf/convert"
	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/safetensors"
)

// The mmproj parameter of the gguf and quantize stages: the vision tower
// of a vision-language checkpoint written as a multimodal projector
// (convert.Options.MMProj, convert_hf_to_gguf.py --mmproj) beside the text
// GGUF, one more output of the same stage:
//
//	mmproj: auto    write it when the checkpoint has a vision tower
//	                (model.visual.* tensors); a text-only one gets none
//	mmproj: true    write it; a checkpoint without a vision tower fails
//	mmproj: false   (the default) do not
//
// Its file is mmproj-<Name>-<TYPE>.gguf (the converter's name, Name the
// stage's model_name), F16 whatever the stage's outtype, except that the
// gguf stage's outtype f32, bf16 or q8_0 applies to it too, as the
// converter's --outtype does.
const (
	mmprojOff  = ""
	mmprojAuto = "auto"
	mmprojOn   = "true"
)

// parseMMProj reads the mmproj parameter: auto, or a boolean.
func parseMMProj(p *Params) (string, error) {
	v, err := p.String("mmproj", false)
	if err != nil {
		return "", err
	}
	switch strings.ToLower(v) {
	case "", "false", "no", "off":
		return mmprojOff, nil
	case "auto":
		return mmprojAuto, nil
	case "true", "yes", "on":
		return mmprojOn, nil
	}
	return "", p.Errorf("mmproj", "want auto, true or false, got %q", v)
}

// mmprojPlan plans the mmproj of the checkpoint at dir for the stage's
// mode: nil when there is none to write (off, or auto and no vision
// tower). The caller closes the checkpoint.
func mmprojPlan(dir, mode string, ot convert.OutType) (*safetensors.Checkpoint, *convert.Plan, error) {
	if mode == mmprojOff {
		return nil, nil, nil
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, nil, err
	}
	if mode == mmprojAuto && !convert.HasVisionTower(ck) {
		ck.Close()
		return nil, nil, nil
	}
	p, err := convert.NewPlan(ck, convert.Options{OutType: ot, MMProj: true})
	if err != nil {
		ck.Close()
		return nil, nil, fmt.Errorf("mmproj: %w", err)
	}
	return ck, p, nil
}

// mmprojSummary is what plan says of the mmproj a stage will write.
func mmprojSummary(mode string, p *convert.Plan) string {
	switch {
	case p != nil:
		return fmt.Sprintf(" + mmproj (vision tower, %s, %d tensors, %s)", p.OutType, len(p.Tensors), FormatBytes(p.Layout.Size))
	case mode == mmprojAuto:
		return " (no vision tower: no mmproj)"
	}
	return ""
}

// writeMMProj writes the planned mmproj into the stage's work dir (its own
// .partial and journal there, resumed as the text GGUF's) and adopts it.
func writeMMProj(ctx context.Context, env *Env, work string, ck *safetensors.Checkpoint, p *convert.Plan) (manifest.Output, error) {
	name := p.DefaultFileName(false)
	out := filepath.Join(work, name)
	for _, w := range p.Warnings {
		env.Log.Warn("mmproj: " + w)
	}
	res, err := convert.Run(ctx, ck, p, out, convert.RunOptions{
		Jobs: env.Jobs, Progress: env.Progress.Add, Digest: true,
		Journal: filepath.Join(work, name+".journal"),
	})
	if err != nil {
		return manifest.Output{}, err
	}
	d, n, err := env.AdoptKnown(out, manifest.NewDigest(res.Digest[:]), res.Size)
	if err != nil {
		return manifest.Output{}, err
	}
	return manifest.Output{Path: name, Digest: d, Size: n}, nil
}
