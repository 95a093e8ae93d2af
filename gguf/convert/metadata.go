package convert

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"unicode"

	"github.com/ferry-llm/ferry/gguf"
)

// metadata writes every KV in convert_hf_to_gguf.py's order:
// general.architecture, general.type, general.sampling.*, general.name and
// the other name parts, general.size_label, the family's {arch}.* keys
// (ending with general.file_type and the family extras),
// general.quantization_version, then the tokenizer.
func (m *model) metadata(kv *kvList, tensors []TensorPlan) error {
	kv.add(gguf.Str("general.architecture", m.fam.arch()))
	kv.add(gguf.Str("general.type", "model"))
	if err := m.generalKeys(kv, tensors); err != nil {
		return err
	}
	if err := m.fam.params(m, kv); err != nil {
		return err
	}
	kv.add(gguf.U32("general.quantization_version", 2)) // GGML_QNT_VERSION
	return m.fam.vocab(m, kv)
}

// generalKeys is gguf.Metadata.load + set_gguf_meta_model without a model
// card: sampling defaults from generation_config.json, then the name
// heuristics over config.json's _name_or_path and the directory name.
func (m *model) generalKeys(kv *kvList, tensors []TensorPlan) error {
	gen := readJSONMap(filepath.Join(m.dir, "generation_config.json"))
	str := func(key string) (string, bool) { s, ok := gen[key].(string); return s, ok }
	num := func(key string) (float64, bool) { return jsonFloat(gen[key]) }
	integer := func(key string) (int64, bool) { return jsonInt(gen[key]) }
	if s, ok := str("sequence"); ok {
		kv.add(gguf.Str("general.sampling.sequence", s))
	}
	if v, ok := integer("top_k"); ok {
		kv.add(gguf.I32("general.sampling.top_k", int32(v)))
	}
	for _, f := range []struct{ src, key string }{{"top_p", "top_p"}, {"min_p", "min_p"}, {"xtc_probability", "xtc_probability"}, {"xtc_threshold", "xtc_threshold"}, {"temperature", "temp"}} {
		if v, ok := num(f.src); ok {
			kv.add(gguf.F32("general.sampling."+f.key, float32(v)))
		}
	}
	if v, ok := integer("penalty_last_n"); ok {
		kv.add(gguf.I32("general.sampling.penalty_last_n", int32(v)))
	}
	if v, ok := num("penalty_repeat"); ok {
		kv.add(gguf.F32("general.sampling.penalty_repeat", float32(v)))
	}
	if v, ok := integer("mirostat"); ok {
		kv.add(gguf.I32("general.sampling.mirostat", int32(v)))
	}
	for _, k := range []string{"mirostat_tau", "mirostat_eta"} {
		if v, ok := num(k); ok {
			kv.add(gguf.F32("general.sampling."+k, float32(v)))
		}
	}

	total, shared, expert, nExpert := paramCounts(tensors)
	var md nameMeta
	if s, ok := m.cfg.Raw["_name_or_path"].(string); ok && strings.Count(s, "/") <= 1 {
		md.fill(modelIDComponents(s, total, true))
	}
	md.fill(modelIDComponents(dirName(m.dir), total, true))
	if m.opts.Name != "" {
		md.name, md.set = m.opts.Name, true
	}
	if !md.set {
		md.name, md.set = dirName(m.dir), true
	}
	if md.sizeLabel == "" && total > 0 {
		md.sizeLabel = sizeLabel(total, shared, expert, nExpert)
	}
	kv.add(gguf.Str("general.name", md.name))
	if md.version != "" {
		kv.add(gguf.Str("general.version", md.version))
	}
	if md.org != "" {
		kv.add(gguf.Str("general.organization", md.org))
	}
	if md.finetune != "" {
		kv.add(gguf.Str("general.finetune", md.finetune))
	}
	if md.basename != "" {
		kv.add(gguf.Str("general.basename", md.basename))
	}
	if md.sizeLabel != "" {
		kv.add(gguf.Str("general.size_label", md.sizeLabel))
	}
	return nil
}

// dirName is Path(dir).name.
func dirName(dir string) string {
	c := filepath.Clean(dir)
	if c == "." || c == string(filepath.Separator) {
		return ""
	}
	return filepath.Base(c)
}

func readJSONMap(path string) map[string]any {
	b, err := os.ReadFile(path)
	if err != nil || len(b) > 16<<20 {
		return nil
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	var out map[string]any
	if dec.Decode(&out) != nil {
		return nil // gguf-py ignores an unreadable generation_config.json too
	}
	return out
}

type nameMeta struct {
	set                                               bool
	name, org, basename, finetune, version, sizeLabel string
}

type idComponents struct {
	ok                                                bool
	full, org, basename, finetune, version, sizeLabel string
	hasOrg                                            bool
}

// fill sets each field still unset (Metadata.apply_metadata_heuristic).
func (n *nameMeta) fill(c idComponents) {
	if !c.ok {
		return
	}
	if !n.set {
		n.name, n.set = idToTitle(c.full), true
	}
	if n.org == "" && c.hasOrg {
		n.org = idToTitle(c.org)
	}
	if n.basename == "" {
		n.basename = c.basename
	}
	if n.finetune == "" {
		n.finetune = c.finetune
	}
	if n.version == "" {
		n.version = c.version
	}
	if n.sizeLabel == "" {
		n.sizeLabel = c.sizeLabel
	}
}

var (
	reVersion  = regexp.MustCompile(`(?i)^(v|iter)?\d+([.]\d+)*$`)
	reQuant    = regexp.MustCompile(`(?i)^(i?q\d(_\w)*|b?fp?(16|32))$`)
	reSize     = regexp.MustCompile(`(?i)^((([A]|\d+[x])?\d+([._]\d+)?[KMBT][\d]?)|small|mini|medium|large|x?xl)$`)
	reFinetune = regexp.MustCompile(`(?i)^(chat|instruct|vision|lora)$`)
	reTitleNo  = regexp.MustCompile(`^(v\d+(?:\.\d+)*|\d.*)$`)
)

// modelIDComponents is Metadata.get_model_id_components.
func modelIDComponents(id string, totalParams int64, present bool) idComponents {
	if !present {
		return idComponents{}
	}
	if strings.Contains(id, " ") {
		return idComponents{ok: true, full: id}
	}
	c := idComponents{ok: true}
	full := id
	if i := strings.Index(id, "/"); i >= 0 {
		c.org, c.hasOrg = id[:i], true
		full = id[i+1:]
	}
	if c.hasOrg && len(c.org) > 0 && c.org[0] == '.' {
		c.org, c.hasOrg = "", false
	}
	c.full = full
	var parts []string
	for _, p := range strings.Split(full, "-") {
		if p != "" {
			parts = append(parts, p)
		}
	}
	types := make([]map[string]bool, len(parts))
	for i := range types {
		types[i] = map[string]bool{}
	}
	for i, part := range parts {
		switch {
		case reVersion.MatchString(part):
			types[i]["version"] = true
		case reQuant.MatchString(part):
			types[i]["type"] = true
			parts[i] = strings.ToUpper(part)
		case i > 0 && reSize.MatchString(part):
			part = strings.ReplaceAll(part, "_", ".")
			if last := part[len(part)-1]; last >= '0' && last <= '9' {
				part = part[:len(part)-2] + "." + part[len(part)-1:] + part[len(part)-2:len(part)-1]
			}
			if len(part) > 1 && part[len(part)-2] >= '0' && part[len(part)-2] <= '9' && strings.ContainsRune("kmbt", rune(part[len(part)-1])) {
				part = part[:len(part)-1] + strings.ToUpper(part[len(part)-1:])
			}
			if totalParams != 0 {
				if f, err := strconv.ParseFloat(part[:len(part)-1], 64); err == nil && !strings.ContainsAny(part[:len(part)-1], "_xX") {
					label := f * math.Pow(1000, float64(strings.IndexByte(" KMBT", part[len(part)-1])))
					tp := float64(totalParams)
					if (totalParams < 0 && label < float64(-totalParams/8)) || (totalParams > 0 && math.Abs(label-tp) > float64(7*totalParams/8)) {
						types[i]["finetune"] = true
						part = part[:len(part)-1] + strings.ToLower(part[len(part)-1:])
					}
				}
			}
			if len(types[i]) == 0 {
				types[i]["size_label"] = true
			}
			parts[i] = part
		case i > 0 && reFinetune.MatchString(part):
			if totalParams < 0 && strings.ToLower(part) == "lora" {
				types[i]["type"] = true
			} else {
				types[i]["finetune"] = true
			}
		}
	}
	hasNumericSize := false
	for i, p := range parts {
		if types[i]["size_label"] && strings.ContainsAny(p, "0123456789") {
			hasNumericSize = true
		}
	}
	if hasNumericSize {
		for i, p := range parts {
			if types[i]["size_label"] && isAlpha(p) {
				delete(types[i], "size_label")
			}
		}
	}
	atStart := true
	for i, p := range parts {
		if atStart && ((len(types[i]) == 0 && unicode.IsLetter([]rune(p)[0])) || types[i]["version"]) {
			types[i]["basename"] = true
		} else {
			atStart = false
			if len(types[i]) == 0 {
				types[i]["finetune"] = true
			}
		}
	}
	for i := len(parts) - 1; i >= 0; i-- {
		if types[i]["basename"] && len(types[i]) > 1 {
			delete(types[i], "basename")
		} else {
			break
		}
	}
	join := func(pred func(map[string]bool) bool, dedup bool) string {
		var out []string
		seen := map[string]bool{}
		for i, p := range parts {
			if pred(types[i]) {
				if dedup && seen[p] {
					continue
				}
				seen[p] = true
				out = append(out, p)
			}
		}
		return strings.Join(out, "-")
	}
	c.basename = join(func(t map[string]bool) bool { return t["basename"] }, false)
	c.sizeLabel = join(func(t map[string]bool) bool { return t["size_label"] }, true)
	c.finetune = join(func(t map[string]bool) bool { return t["finetune"] }, false)
	c.version = join(func(t map[string]bool) bool { return t["version"] && !t["basename"] }, false)
	if c.sizeLabel == "" && c.finetune == "" && c.version == "" {
		c.basename = ""
	}
	return c
}

func isAlpha(s string) bool {
	for _, r := range s {
		if !unicode.IsLetter(r) {
			return false
		}
	}
	return s != ""
}

// idToTitle is Metadata.id_to_title: Python str.title() on all-lowercase
// words that are not versions or numbers.
func idToTitle(s string) string {
	words := strings.Fields(strings.ReplaceAll(strings.TrimSpace(s), "-", " "))
	for i, w := range words {
		if pyIsLower(w) && !reTitleNo.MatchString(w) {
			words[i] = pyTitle(w)
		}
	}
	return strings.Join(words, " ")
}

func pyIsLower(s string) bool {
	cased := false
	for _, r := range s {
		if unicode.IsUpper(r) || unicode.IsTitle(r) {
			return false
		}
		if unicode.IsLower(r) {
			cased = true
		}
	}
	return cased
}

func pyTitle(s string) string {
	var b strings.Builder
	prevCased := false
	for _, r := range s {
		cased := unicode.IsUpper(r) || unicode.IsLower(r) || unicode.IsTitle(r)
		if cased {
			if prevCased {
				r = unicode.ToLower(r)
			} else {
				r = unicode.ToTitle(r)
			}
		}
		b.WriteRune(r)
		prevCased = cased
	}
	return b.String()
}

// paramCounts is GGUFWriter.get_total_parameter_count over the planned
// tensors (shapes in torch order).
func paramCounts(tensors []TensorPlan) (total, shared, expert, nExpert int64) {
	var expertSum, nExpTensors int64
	for _, t := range tensors {
		shape := t.vt.Shape
		size := int64(1)
		for _, d := range shape {
			size *= d
		}
		if strings.Contains(t.Name, "_exps.") {
			if len(shape) >= 3 {
				e := shape[len(shape)-3]
				if strings.Contains(t.Name, ".bias") {
					e = shape[len(shape)-2]
				}
				expert += size / e
				expertSum += e
				nExpTensors++
			} else {
				shared += size
			}
		} else {
			shared += size
		}
		total += size
	}
	if nExpTensors > 0 {
		nExpert = expertSum / nExpTensors
	}
	return
}

// sizeLabel is gguf.size_label.
func sizeLabel(total, shared, expert, nExpert int64) string {
	if nExpert > 0 {
		return fmt.Sprintf("%dx%s", nExpert, roundedCount(abs64(shared)+abs64(expert), 2))
	}
	return roundedCount(abs64(total), 2)
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// roundedCount is model_weight_count_rounded_notation.
func roundedCount(n int64, minDigits int) string {
	var scaled float64
	var suffix string
	f := float64(n)
	switch {
	case f > 1e12:
		scaled, suffix = f*1e-12, "T"
	case f > 1e9:
		scaled, suffix = f*1e-9, "B"
	case f > 1e6:
		scaled, suffix = f*1e-6, "M"
	default:
		scaled, suffix = f*1e-3, "K"
	}
	// len(str(round(scaled)).lstrip('0')); Python's round is half-even.
	r := strconv.FormatFloat(math.RoundToEven(scaled), 'f', 0, 64)
	fix := max(minDigits-len(strings.TrimLeft(r, "0")), 0)
	return strconv.FormatFloat(scaled, 'f', fix, 64) + suffix
}
