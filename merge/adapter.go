// Package merge merges PEFT LoRA / DoRA adapters into a safetensors
// checkpoint, shard by shard and row block by row block, with PEFT's float32
// arithmetic so that the result equals merge_and_unload bit for bit, and
// with every tensor the adapter does not touch (mtp.* included) copied byte
// for byte.
//
// The work is split as the house style asks: Inventory reads the adapter
// config and every header (no weights) and makes every decision into a
// Plan; Execute carries the plan out and decides nothing.
package merge

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Adapter file names PEFT writes.
const (
	AdapterConfigName  = "adapter_config.json"
	AdapterWeightsName = "adapter_model.safetensors"
)

// maxAdapterConfigSize bounds what ParseAdapterConfig is handed: a real
// adapter_config.json is a few kB; rank/alpha patterns for every module of a
// large model stay well under a megabyte.
const maxAdapterConfigSize = 8 << 20

// AdapterConfig is the part of PEFT's adapter_config.json (LoraConfig) that
// decides the merge.
type AdapterConfig struct {
	PeftType    string
	R           int
	LoraAlpha   float64
	UseDoRA     bool
	UseRSLoRA   bool
	FanInFanOut bool
	LoraBias    bool
	Bias        string // "none" | "all" | "lora_only"

	// TargetRegex is set when target_modules is a string: PEFT then
	// re.fullmatch-es it against the module name. Otherwise TargetNames
	// holds the list (a name matches exactly or as a ".name" suffix).
	TargetRegex  *regexp.Regexp
	TargetAll    bool // "all-linear": every module with weights counts as targeted
	TargetNames  []string
	ExcludeRegex *regexp.Regexp
	ExcludeNames []string

	// LayersToTransform restricts list targets to these layer indices
	// (nil: all). LayersPattern names the module list ("layers", "h", …).
	LayersToTransform []int
	LayersPattern     []string

	RankPattern   []PatternInt   // in file order: the first match wins
	AlphaPattern  []PatternFloat // in file order
	ModulesToSave []string
}

// PatternInt is one rank_pattern entry.
type PatternInt struct {
	Key   string
	re    *regexp.Regexp
	Value int
}

// PatternFloat is one alpha_pattern entry.
type PatternFloat struct {
	Key   string
	re    *regexp.Regexp
	Value float64
}

// ParseAdapterConfig parses adapter_config.json; path is used in errors.
// Options that change what a merge means and that ferry does not implement
// (layer_replication, target_parameters, trainable_token_indices, aLoRA,
// non-LoRA PEFT types) are refused rather than ignored.
func ParseAdapterConfig(data []byte, path string) (*AdapterConfig, error) {
	bad := func(format string, args ...any) error {
		return &InputError{Path: path, Offset: -1, Err: fmt.Errorf("%w: "+format, append([]any{ErrAdapterConfig}, args...)...)}
	}
	if len(data) > maxAdapterConfigSize {
		return nil, bad("%d bytes is over the %d-byte limit", len(data), maxAdapterConfigSize)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var raw map[string]json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return nil, bad("not a JSON object: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, bad("data after the JSON object")
	}
	c := &AdapterConfig{PeftType: "LORA", Bias: "none"}
	isNull := func(k string) bool {
		v, ok := raw[k]
		return !ok || string(bytes.TrimSpace(v)) == "null"
	}
	get := func(k string, dst any) error {
		if isNull(k) {
			return nil
		}
		d := json.NewDecoder(bytes.NewReader(raw[k]))
		d.UseNumber()
		if err := d.Decode(dst); err != nil {
			return bad("%s: %v", k, err)
		}
		return nil
	}
	if err := get("peft_type", &c.PeftType); err != nil {
		return nil, err
	}
	if c.PeftType != "LORA" {
		return nil, bad("peft_type %q: only LORA adapters (LoRA, DoRA, rsLoRA) can be merged", c.PeftType)
	}
	var r, alpha json.Number
	if err := get("r", &r); err != nil {
		return nil, err
	}
	if err := get("lora_alpha", &alpha); err != nil {
		return nil, err
	}
	if r == "" {
		c.R = 8 // LoraConfig's default
	} else if n, err := r.Int64(); err != nil || n <= 0 || n > 1<<20 {
		return nil, bad("r = %s: want a positive integer", r)
	} else {
		c.R = int(n)
	}
	if alpha == "" {
		c.LoraAlpha = 8 // LoraConfig's default
	} else if f, err := alpha.Float64(); err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, bad("lora_alpha = %s: want a number", alpha)
	} else {
		c.LoraAlpha = f
	}
	for _, b := range []struct {
		key string
		dst *bool
	}{{"use_dora", &c.UseDoRA}, {"use_rslora", &c.UseRSLoRA}, {"fan_in_fan_out", &c.FanInFanOut}, {"lora_bias", &c.LoraBias}} {
		if err := get(b.key, b.dst); err != nil {
			return nil, err
		}
	}
	if err := get("bias", &c.Bias); err != nil {
		return nil, err
	}
	switch c.Bias {
	case "none", "all", "lora_only":
	default:
		return nil, bad("bias %q: want none, all or lora_only", c.Bias)
	}
	if c.LoraBias && c.UseDoRA {
		return nil, bad("lora_bias together with use_dora (PEFT rejects this combination)")
	}

	// Options whose merge ferry does not implement: refuse, never ignore.
	for _, k := range []string{"layer_replication", "target_parameters", "trainable_token_indices", "alora_invocation_tokens"} {
		if !isNull(k) && !emptyJSON(raw[k]) {
			return nil, bad("%s is set; ferry cannot merge such adapters", k)
		}
	}
	for _, k := range []string{"use_qalora", "use_bdlora"} {
		var on bool
		if !isNull(k) {
			if err := json.Unmarshal(raw[k], &on); err == nil && on {
				return nil, bad("%s is set; ferry cannot merge such adapters", k)
			}
		}
	}

	// target_modules: a list, or a string regex (full match), or all-linear.
	if isNull("target_modules") {
		return nil, bad("target_modules is missing")
	}
	var err error
	if c.TargetNames, c.TargetRegex, err = parseNamesOrRegex(raw["target_modules"]); err != nil {
		return nil, bad("target_modules: %v", err)
	}
	if c.TargetRegex != nil && c.TargetRegex.String() == `^(?:all-linear)$` {
		c.TargetRegex, c.TargetAll = nil, true
	}
	if !isNull("exclude_modules") {
		if c.ExcludeNames, c.ExcludeRegex, err = parseNamesOrRegex(raw["exclude_modules"]); err != nil {
			return nil, bad("exclude_modules: %v", err)
		}
	}
	if !isNull("layers_to_transform") {
		var one int
		if json.Unmarshal(raw["layers_to_transform"], &one) == nil {
			c.LayersToTransform = []int{one}
		} else if err := json.Unmarshal(raw["layers_to_transform"], &c.LayersToTransform); err != nil {
			return nil, bad("layers_to_transform: want an integer or a list of integers")
		}
	}
	if !isNull("layers_pattern") {
		var one string
		if json.Unmarshal(raw["layers_pattern"], &one) == nil {
			if one != "" {
				c.LayersPattern = []string{one}
			}
		} else if err := json.Unmarshal(raw["layers_pattern"], &c.LayersPattern); err != nil {
			return nil, bad("layers_pattern: want a string or a list of strings")
		}
	}
	if c.RankPattern, err = parsePatternInts(raw["rank_pattern"]); err != nil {
		return nil, bad("rank_pattern: %v", err)
	}
	if c.AlphaPattern, err = parsePatternFloats(raw["alpha_pattern"]); err != nil {
		return nil, bad("alpha_pattern: %v", err)
	}
	if err := get("modules_to_save", &c.ModulesToSave); err != nil {
		return nil, err
	}
	return c, nil
}

func emptyJSON(v json.RawMessage) bool {
	s := string(bytes.TrimSpace(v))
	return s == "[]" || s == "{}" || s == `""` || s == "false"
}

// parseNamesOrRegex reads PEFT's target_modules / exclude_modules: a list of
// module-name suffixes, or one string used as a full-match regex.
func parseNamesOrRegex(v json.RawMessage) ([]string, *regexp.Regexp, error) {
	var s string
	if err := json.Unmarshal(v, &s); err == nil {
		re, err := pyRegexp(`^(?:` + s + `)$`)
		if err != nil {
			return nil, nil, fmt.Errorf("regex %q: %v", s, err)
		}
		return nil, re, nil
	}
	var list []string
	if err := json.Unmarshal(v, &list); err != nil {
		return nil, nil, errors.New("want a list of names or a regex string")
	}
	return list, nil, nil
}

// pyRegexp compiles a Python re pattern with Go's RE2 syntax, which shares
// the constructs adapter configs use (alternation, classes, repetition);
// look-arounds and back-references are rejected with RE2's message.
func pyRegexp(p string) (*regexp.Regexp, error) { return regexp.Compile(p) }

// patternRE is PEFT's get_pattern_key match: re.match(rf"(.*\.)?({key})$").
func patternRE(key string) (*regexp.Regexp, error) { return pyRegexp(`^(?:.*\.)?(?:` + key + `)$`) }

// orderedObject decodes a JSON object keeping key order (PEFT tries the
// pattern keys in dict order and the first match wins).
func orderedObject(v json.RawMessage) ([]string, []json.Number, error) {
	if len(bytes.TrimSpace(v)) == 0 || string(bytes.TrimSpace(v)) == "null" {
		return nil, nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, nil, errors.New("want an object")
	}
	var keys []string
	var vals []json.Number
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		k := tok.(string)
		var n json.Number
		if err := dec.Decode(&n); err != nil {
			return nil, nil, fmt.Errorf("%q: want a number", k)
		}
		if seen[k] {
			return nil, nil, fmt.Errorf("%q appears twice", k)
		}
		seen[k] = true
		keys = append(keys, k)
		vals = append(vals, n)
	}
	return keys, vals, nil
}

func parsePatternInts(v json.RawMessage) ([]PatternInt, error) {
	keys, vals, err := orderedObject(v)
	if err != nil {
		return nil, err
	}
	out := make([]PatternInt, len(keys))
	for i, k := range keys {
		n, err := vals[i].Int64()
		if err != nil || n <= 0 || n > 1<<20 {
			return nil, fmt.Errorf("%q: rank %s is not a positive integer", k, vals[i])
		}
		re, err := patternRE(k)
		if err != nil {
			return nil, fmt.Errorf("%q: %v", k, err)
		}
		out[i] = PatternInt{Key: k, re: re, Value: int(n)}
	}
	return out, nil
}

func parsePatternFloats(v json.RawMessage) ([]PatternFloat, error) {
	keys, vals, err := orderedObject(v)
	if err != nil {
		return nil, err
	}
	out := make([]PatternFloat, len(keys))
	for i, k := range keys {
		f, err := vals[i].Float64()
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("%q: alpha %s is not a number", k, vals[i])
		}
		re, err := patternRE(k)
		if err != nil {
			return nil, fmt.Errorf("%q: %v", k, err)
		}
		out[i] = PatternFloat{Key: k, re: re, Value: f}
	}
	return out, nil
}

// RankAlpha returns the rank and alpha PEFT gives module (a name relative to
// the model, without "base_model.model."), honouring rank_pattern and
// alpha_pattern, and the scaling alpha/r (alpha/√r with rsLoRA).
func (c *AdapterConfig) RankAlpha(module string) (r int, alpha, scaling float64) {
	r, alpha = c.R, c.LoraAlpha
	for _, p := range c.RankPattern {
		if p.re.MatchString(module) {
			r = p.Value
			break
		}
	}
	for _, p := range c.AlphaPattern {
		if p.re.MatchString(module) {
			alpha = p.Value
			break
		}
	}
	if c.UseRSLoRA {
		return r, alpha, alpha / math.Sqrt(float64(r))
	}
	return r, alpha, alpha / float64(r)
}

var defaultLayerRE = regexp.MustCompile(`^.*\.[^.]*\.(\d+)\.`)

// Targets reports whether PEFT would wrap module with LoRA under this
// config (tuners_utils.check_target_module_exists, for LoRA configs).
func (c *AdapterConfig) Targets(module string) bool {
	if c.excluded(module) {
		return false
	}
	switch {
	case c.TargetAll:
		return true
	case c.TargetRegex != nil:
		return c.TargetRegex.MatchString(module)
	}
	found := false
	for _, n := range c.TargetNames {
		if module == n {
			return true // an exact name ignores layers_to_transform, as in PEFT
		}
		if strings.HasSuffix(module, "."+n) {
			found = true
		}
	}
	if !found || len(c.LayersToTransform) == 0 {
		return found
	}
	idx := -1
	if len(c.LayersPattern) == 0 {
		if m := defaultLayerRE.FindStringSubmatch(module); m != nil {
			fmt.Sscan(m[1], &idx)
		}
	} else {
		for _, p := range c.LayersPattern {
			re, err := pyRegexp(`^.*\.` + p + `\.(\d+)\.`)
			if err != nil {
				continue
			}
			if m := re.FindStringSubmatch(module); m != nil {
				fmt.Sscan(m[1], &idx)
				break
			}
		}
	}
	if idx < 0 {
		return false
	}
	for _, l := range c.LayersToTransform {
		if l == idx {
			return true
		}
	}
	return false
}

func (c *AdapterConfig) excluded(module string) bool {
	if c.ExcludeRegex != nil {
		return c.ExcludeRegex.MatchString(module)
	}
	for _, n := range c.ExcludeNames {
		if module == n || strings.HasSuffix(module, "."+n) {
			return true
		}
	}
	return false
}

// SavesModule reports whether module is one of modules_to_save (PEFT matches
// the configured names as module-name suffixes).
func (c *AdapterConfig) SavesModule(module string) bool {
	for _, n := range c.ModulesToSave {
		if module == n || strings.HasSuffix(module, "."+n) {
			return true
		}
	}
	return false
}

// ReadAdapterConfig reads dir/adapter_config.json.
func ReadAdapterConfig(dir string) (*AdapterConfig, error) {
	p := filepath.Join(dir, AdapterConfigName)
	fh, err := os.Open(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, &InputError{Path: p, Offset: -1, Err: fmt.Errorf("%w: no %s (is this a PEFT adapter directory?)", ErrNoAdapter, AdapterConfigName)}
		}
		return nil, err
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, maxAdapterConfigSize+1))
	if err != nil {
		return nil, err
	}
	return ParseAdapterConfig(data, p)
}

// adapterWeightsPath finds the safetensors weights of an adapter directory,
// refusing pickle-only adapters with a message saying why.
func adapterWeightsPath(dir string) (string, error) {
	p := filepath.Join(dir, AdapterWeightsName)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	for _, pickle := range []string{"adapter_model.bin", "adapter_model.pt", "adapter_model.pth", "adapter_model.ckpt"} {
		if _, err := os.Stat(filepath.Join(dir, pickle)); err == nil {
			return "", &InputError{Path: filepath.Join(dir, pickle), Offset: -1, Err: fmt.Errorf("%w: the adapter has only a pickle file and no %s; ferry never unpickles (pickle can run code). Re-save it with safetensors (PEFT: model.save_pretrained(dir, safe_serialization=True))", ErrPickleOnly, AdapterWeightsName)}
		}
	}
	return "", &InputError{Path: p, Offset: -1, Err: fmt.Errorf("%w: no %s", ErrNoAdapter, AdapterWeightsName)}
}
