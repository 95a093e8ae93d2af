package verify

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/ferry-llm/ferry/internal/modulepaths"
	"github.com/ferry-llm/ferry/tensor"
)

// decide sets the verdict from what the analysis recorded. countMismatch
// says the head's tensors are there but in more layers or other blocks than
// the metadata says: inconsistent rather than partial.
//
// rep.Present is set by the caller: the head's tensors in the file, by the
// one definition FindHead and FindGGUFHead share (checkpointHead,
// ggufHead). Expected is those and the required ones missing.
func decide(rep *Report, countMismatch bool) {
	present := rep.Present
	sort.Strings(rep.Missing)
	rep.Missing = slices.Compact(rep.Missing)
	rep.Expected = rep.Present + len(rep.Missing)
	if rep.FoundLayers == nil {
		rep.FoundLayers = []int{}
	}
	switch {
	case rep.Promised == 0 && present == 0:
		rep.Verdict = Absent
	case rep.Promised == 0:
		rep.Verdict = Inconsistent
	case present == 0:
		rep.Verdict = Dropped
	case countMismatch:
		rep.Verdict = Inconsistent
	case len(rep.Missing) > 0:
		rep.Verdict = Partial
	case len(rep.Problems) > 0:
		rep.Verdict = Inconsistent
	default:
		rep.Verdict = OK
	}
}

// promise renders what promised the head, for messages.
func promise(rep *Report) string {
	return fmt.Sprintf("%s = %d", rep.PromisedBy, rep.Promised)
}

// explain writes the message for a safetensors or MLX verdict.
func (a *ckAnalysis) explain() {
	rep := a.rep
	where := "config.json"
	switch rep.Verdict {
	case OK:
		rep.Message = fmt.Sprintf("%s promises %d MTP layer(s) (%s) and all %d head tensors are in the weight index, consistent with the trunk",
			where, rep.Promised, rep.PromisedBy, rep.Expected)
	case Absent:
		rep.Message = "no MTP head: config.json promises none (no mtp_num_hidden_layers or num_nextn_predict_layers) and the weight index has no head tensors"
		if rec, ok := a.cfg.Raw[modulepaths.MTPDroppedKey].(map[string]any); ok {
			rep.Message = fmt.Sprintf("no MTP head, left out on purpose: config.json %s records that ferry mlx quantize dropped it (%v layer(s), %v tensors) because released mlx-lm discards it at load, and set %v to 0. "+
				"Quantize again with --keep-mtp to keep it", modulepaths.MTPDroppedKey, rec["layers"], rec["tensors"], rec["key"])
		}
	case Dropped:
		head := "mtp.* tensor"
		if rep.Convention == ConvNextN {
			head = fmt.Sprintf("model.layers.%d.* tensor", rep.TrunkLayers)
		}
		rep.Message = fmt.Sprintf("config.json promises %d MTP layer(s) (%s) but no %s is in the weight index. ", rep.Promised, promise(rep), head)
		if rep.Format == FormatMLX {
			rep.Message += "mlx-lm's convert drops the head: its sanitize() discards every \"mtp.\" key (and DeepSeek/GLM layers >= num_hidden_layers). " +
				"Fix: quantize again from a checkpoint that has the head with a tool that keeps it (ferry mlx quantize), or keep the head in an mtp.safetensors side file."
		} else {
			rep.Message += "A PEFT merge_and_unload() / transformers save_pretrained() drops it: transformers ignores mtp.* on load, so every merge of a Qwen3.5 loses the head while config.json still promises it. " +
				"Fix: re-merge with `ferry merge`, which copies the head from the base verbatim (or copy the base's mtp.* tensors into the checkpoint and its index)."
		}
	case Partial:
		rep.Message = fmt.Sprintf("%s promises %d MTP layer(s) (%s) but only %d of %d head tensors are in the weight index; missing: %s",
			where, rep.Promised, rep.PromisedBy, rep.Present, rep.Expected, abbreviate(rep.Missing, 6))
	case Inconsistent:
		if rep.Promised == 0 {
			rep.Message = "MTP head tensors are in the weight index but config.json promises no MTP layers (no mtp_num_hidden_layers / num_nextn_predict_layers); a loader will ignore or reject them. Fix config.json or remove the tensors."
		} else {
			rep.Message = "the MTP head is present but disagrees with the config or the trunk: " + abbreviate(rep.Problems, 4)
		}
	}
}

func abbreviate(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s, … (%d more)", strings.Join(items[:n], ", "), len(items)-n)
}

// mlxNotes adds MLX-specific notes and the norm-shift warning (mlx.md §5).
func (a *ckAnalysis) mlxNotes(mtpNames []string) {
	rep := a.rep
	inModel := 0
	for _, n := range mtpNames {
		if t := a.w.byName[n]; t != nil && !sideFileRE.MatchString(t.file) {
			inModel++
		}
	}
	if inModel == 0 {
		return
	}
	rep.Notes = append(rep.Notes, "mlx-lm (v0.31.3, 0.32.0) discards mtp.* at load; only a loader with MTP support (e.g. mlx-lm PR #990) uses the head")
	// Hybrid Qwen models: sanitize decides the norm +1 shift from the
	// conv1d layout (HF [C,1,K] = unsanitized) — and, from PR #869 through
	// v0.31.3, also from the mere presence of mtp.* keys.
	var conv *wTensor
	for _, n := range a.w.names {
		if strings.HasSuffix(n, "conv1d.weight") && !strings.Contains(n, "mtp.") {
			conv = a.w.byName[n]
			break
		}
	}
	if conv == nil || len(conv.shape) != 3 {
		return
	}
	if conv.shape[2] != 1 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("%s is in HF layout %v: mlx-lm shifts the zero-centred norms by +1 once at load, as it should", conv.name, conv.shape))
		return
	}
	evidence := ""
	if a.opts.Deep {
		name, mean, ok := a.trunkNormMean()
		if ok && mean < 0.5 {
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s is in MLX layout %v but --deep finds trunk norm %s averaging %.3f (zero-centred, not yet shifted): mlx-lm's extra shift is the only one, so no double shift",
				conv.name, conv.shape, name, mean))
			return
		}
		if ok {
			evidence = fmt.Sprintf("; --deep: trunk norm %s averages %.3f", name, mean)
		}
	}
	rep.Warnings = append(rep.Warnings, fmt.Sprintf(
		"double norm shift: %d mtp.* tensor(s) sit in model*.safetensors of a directory already in MLX layout (%s is %v, so the norms are already shifted by +1%s). "+
			"mlx-lm from PR #869 through v0.31.3 shifts every norm again when mtp.* keys are among the weights it loads (γ≈1 becomes ≈2: silent garbage); mlx-lm 0.32.0 (PR #1623, 4eeaf209) does not. "+
			"Load with mlx-lm 0.32.0 or later, or quantize again with ferry mlx quantize --keep-mtp, which keeps the head in mtp.safetensors where no mlx-lm looks, or write the raw HF layout",
		inModel, conv.name, conv.shape, evidence))
}

// trunkNormMean reads one trunk input_layernorm (a few KB) and averages it:
// ≈1 for shifted (MLX) norms, ≈0 for HF zero-centred ones.
func (a *ckAnalysis) trunkNormMean() (string, float64, bool) {
	for _, n := range a.w.names {
		t := a.w.byName[n]
		if !strings.HasSuffix(n, "input_layernorm.weight") || strings.Contains(n, "mtp.") || len(t.shape) != 1 || !t.dtype.Convertible() || t.loc.Shard == nil {
			continue
		}
		size := t.loc.Info.Size()
		if size > 1<<24 {
			return "", 0, false
		}
		raw := make([]byte, size)
		if _, err := t.loc.Section().ReadAt(raw, 0); err != nil {
			return "", 0, false
		}
		a.rep.BytesRead += size
		vals := make([]float32, t.shape[0])
		if err := tensor.ToF32(t.dtype, vals, raw); err != nil || len(vals) == 0 {
			return "", 0, false
		}
		var sum float64
		for _, v := range vals {
			sum += float64(v)
		}
		return n, sum / float64(len(vals)), true
	}
	return "", 0, false
}

// deep reads every present head tensor (and its companions).
func (a *ckAnalysis) deep() error {
	rep := a.rep
	seen := map[string]bool{}
	idx := map[string]int{}
	for i, t := range rep.Tensors {
		if t.Present {
			idx[t.Name] = i
		}
	}
	for _, t := range a.present {
		if seen[t.name] {
			continue
		}
		seen[t.name] = true
		l, ok := floatLayouts[t.dtype]
		what := "value"
		if !ok {
			l, what = bytesLayout, "byte"
		}
		res, err := scan(t.loc.Section(), t.loc.Info.Size(), l)
		rep.BytesRead += res.bytes
		if err != nil {
			return fmt.Errorf("%s: tensor %q at offset %d: %w", t.loc.Shard.Path, t.name, t.loc.Shard.DataOffset()+t.loc.Info.Begin, err)
		}
		text, problem := res.text(what, l.unit, t.loc.Shard.DataOffset()+t.loc.Info.Begin)
		if i, ok := idx[t.name]; ok {
			rep.Tensors[i].Deep = text
		}
		if problem != "" {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s (%s): %s", t.name, t.file, problem))
		}
	}
	return nil
}
