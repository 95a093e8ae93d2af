package mlxpack

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Setting is what MLX's affine quantization needs for one module.
type Setting struct {
	Bits      int `json:"bits"`
	GroupSize int `json:"group_size"`
}

func (s Setting) String() string { return fmt.Sprintf("%d-bit group %d", s.Bits, s.GroupSize) }

// Scheme is one compressed-tensors config group, reduced to what MLX can
// express (symmetric int weights, group strategy).
type Scheme struct {
	Name    string
	Targets []string
	Setting
	targets []matcher
}

// CTConfig is a parsed compressed-tensors quantization_config.
type CTConfig struct {
	Format  string
	Schemes []Scheme // sorted by name
	Ignore  []string
	ignore  []matcher
}

// MLX affine limits (mlx ops.cpp affine_quantize).
var (
	mlxBits = map[int]bool{2: true, 3: true, 4: true, 5: true, 6: true, 8: true}
	mlxGS   = map[int]bool{32: true, 64: true, 128: true}
)

// quantizationConfig finds quantization_config the way mlx-lm's loader
// does: the top level, else text_config's (kimi_k25 nests it there).
func quantizationConfig(raw map[string]any) (map[string]any, bool) {
	if v, ok := raw["quantization_config"]; ok {
		m, ok := v.(map[string]any)
		return m, ok
	}
	if tc, ok := raw["text_config"].(map[string]any); ok {
		if v, ok := tc["quantization_config"]; ok {
			m, ok := v.(map[string]any)
			return m, ok
		}
	}
	return nil, false
}

// ParseCTConfig reads and checks a quantization_config object (numbers as
// json.Number). path names config.json in errors. It refuses, with the
// reason, everything MLX's affine quantization cannot express.
func ParseCTConfig(qc map[string]any, path string) (*CTConfig, error) {
	bad := func(sentinel error, format string, args ...any) error {
		return errf(path, "", sentinel, format, args...)
	}
	method, _ := qc["quant_method"].(string)
	if method != "compressed-tensors" {
		if method == "" {
			return nil, bad(ErrNotCompressed, "quant_method is missing")
		}
		return nil, bad(ErrNotCompressed, "quant_method is %q", method)
	}
	c := &CTConfig{}
	c.Format, _ = qc["format"].(string)
	switch c.Format {
	case "pack-quantized", "mixed-precision":
	default:
		return nil, bad(ErrFormat, "format %q (only pack-quantized int weights map onto MLX affine)", c.Format)
	}
	groups, ok := qc["config_groups"].(map[string]any)
	if !ok || len(groups) == 0 {
		return nil, bad(ErrFormat, "no config_groups")
	}
	names := make([]string, 0, len(groups))
	for n := range groups {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		s, err := parseScheme(n, groups[n], c.Format, path)
		if err != nil {
			return nil, err
		}
		c.Schemes = append(c.Schemes, s)
	}
	if v, ok := qc["ignore"]; ok && v != nil {
		list, ok := v.([]any)
		if !ok {
			return nil, bad(ErrFormat, "ignore is not a list")
		}
		for _, x := range list {
			s, ok := x.(string)
			if !ok {
				return nil, bad(ErrFormat, "ignore entry %v is not a string", x)
			}
			m, err := newMatcher(s)
			if err != nil {
				return nil, bad(ErrFormat, "ignore: %v", err)
			}
			c.Ignore = append(c.Ignore, s)
			c.ignore = append(c.ignore, m)
		}
	}
	return c, nil
}

func parseScheme(name string, v any, topFormat, path string) (Scheme, error) {
	bad := func(sentinel error, format string, args ...any) error {
		return errf(path, "", sentinel, "config_groups.%s: "+format, append([]any{name}, args...)...)
	}
	g, ok := v.(map[string]any)
	if !ok {
		return Scheme{}, bad(ErrFormat, "not an object")
	}
	if f, ok := g["format"].(string); ok && f != "pack-quantized" {
		return Scheme{}, bad(ErrFormat, "format %q", f)
	} else if !ok && topFormat != "pack-quantized" {
		return Scheme{}, bad(ErrFormat, "no per-group format under format %q", topFormat)
	}
	for _, k := range []string{"input_activations", "output_activations"} {
		if a, ok := g[k]; ok && a != nil {
			return Scheme{}, bad(ErrActivations, "%s are quantized; MLX affine quantizes weights only", k)
		}
	}
	w, ok := g["weights"].(map[string]any)
	if !ok {
		return Scheme{}, bad(ErrFormat, "no weights arguments")
	}
	if t, _ := w["type"].(string); t != "" && t != "int" {
		return Scheme{}, bad(ErrFormat, "weights.type %q (MLX affine needs int)", t)
	}
	if sym, ok := w["symmetric"]; ok && sym != true {
		if sym == false {
			return Scheme{}, bad(ErrAsymmetric, "weights.symmetric is false")
		}
		return Scheme{}, bad(ErrFormat, "weights.symmetric is %v", sym)
	}
	if ao, ok := w["actorder"]; ok && ao != nil && ao != false {
		switch ao {
		case "weight", "static":
			// Columns are permuted while quantizing and put back before
			// saving: groups stay contiguous, no g_idx is stored.
		default:
			return Scheme{}, bad(ErrActOrder, "weights.actorder is %v", ao)
		}
	}
	if d, ok := w["dynamic"]; ok && d != nil && d != false {
		return Scheme{}, bad(ErrStrategy, "weights.dynamic is %v", d)
	}
	bits, err := intField(w, "num_bits", 8)
	if err != nil {
		return Scheme{}, bad(ErrFormat, "%v", err)
	}
	gs, err := intField(w, "group_size", 0)
	if err != nil {
		return Scheme{}, bad(ErrFormat, "%v", err)
	}
	strategy, _ := w["strategy"].(string)
	if strategy == "" {
		switch {
		case gs > 0:
			strategy = "group"
		case gs == -1:
			strategy = "channel"
		default:
			strategy = "tensor"
		}
	}
	if strategy != "group" {
		return Scheme{}, bad(ErrStrategy, "strategy %q (MLX affine has per-group scales only)", strategy)
	}
	if !mlxBits[bits] {
		return Scheme{}, bad(ErrBits, "num_bits %d (MLX affine: 2, 3, 4, 5, 6, 8)", bits)
	}
	if 32%bits != 0 {
		// pack_to_int32 puts 32/bits whole values in each int32 and pads
		// the rest; MLX reads one continuous bit stream. The bytes differ.
		return Scheme{}, bad(ErrBits, "num_bits %d: compressed-tensors packs %d values per int32 (%d padding bits each), MLX packs a continuous %d-bit stream; only 2, 4 and 8 bits carry over without repacking the values",
			bits, 32/bits, 32%bits, bits)
	}
	if !mlxGS[gs] {
		return Scheme{}, bad(ErrGroupSize, "group_size %d (MLX affine: 32, 64, 128)", gs)
	}
	s := Scheme{Name: name, Setting: Setting{Bits: bits, GroupSize: gs}}
	targets, ok := g["targets"].([]any)
	if !ok || len(targets) == 0 {
		return Scheme{}, bad(ErrFormat, "no targets")
	}
	for _, t := range targets {
		ts, ok := t.(string)
		if !ok {
			return Scheme{}, bad(ErrFormat, "target %v is not a string", t)
		}
		m, err := newMatcher(ts)
		if err != nil {
			return Scheme{}, bad(ErrFormat, "targets: %v", err)
		}
		s.Targets = append(s.Targets, ts)
		s.targets = append(s.targets, m)
	}
	return s, nil
}

func intField(m map[string]any, key string, def int) (int, error) {
	v, ok := m[key]
	if !ok || v == nil {
		return def, nil
	}
	n, ok := v.(json.Number)
	if !ok {
		return 0, fmt.Errorf("%s is %v, not a number", key, v)
	}
	i, err := n.Int64()
	if err != nil || i < -1 || i > 1<<20 {
		return 0, fmt.Errorf("%s is %v, not a small integer", key, v)
	}
	return int(i), nil
}

// matcher follows compressed-tensors' match_name: "re:" targets match from
// the start of the module name (Python re.match), a class name ("Linear")
// matches every quantizable module, anything else must equal the name.
type matcher struct {
	text  string
	rank  int // 3 exact name, 2 regex, 1 class name
	re    *regexp.Regexp
	class bool
}

func newMatcher(t string) (matcher, error) {
	if rest, ok := strings.CutPrefix(t, "re:"); ok {
		re, err := regexp.Compile(`^(?:` + rest + `)`)
		if err != nil {
			return matcher{}, fmt.Errorf("regex %q: %v", t, err)
		}
		return matcher{text: t, rank: 2, re: re}, nil
	}
	if t != "" && t[0] >= 'A' && t[0] <= 'Z' && !strings.Contains(t, ".") {
		// A module class. Packed tensors exist only for Linear and
		// Embedding modules, so a class target matches any packed module.
		return matcher{text: t, rank: 1, class: true}, nil
	}
	return matcher{text: t, rank: 3}, nil
}

func (m matcher) match(module string) bool {
	switch {
	case m.re != nil:
		return m.re.MatchString(module)
	case m.class:
		return true
	default:
		return m.text == module
	}
}

// Ignored reports whether module is on the ignore list (class entries are
// not considered: they would ignore every module).
func (c *CTConfig) Ignored(module string) (string, bool) {
	for _, m := range c.ignore {
		if !m.class && m.match(module) {
			return m.text, true
		}
	}
	return "", false
}

// SchemeFor finds the config group that quantized module: the most
// specific matching target wins (exact name, then regex, then class);
// equally specific matches must agree.
func (c *CTConfig) SchemeFor(module string) (*Scheme, error) {
	var best *Scheme
	bestRank := 0
	for i := range c.Schemes {
		s := &c.Schemes[i]
		for _, m := range s.targets {
			if !m.match(module) {
				continue
			}
			switch {
			case m.rank > bestRank:
				best, bestRank = s, m.rank
			case m.rank == bestRank && best != s && best.Setting != s.Setting:
				return nil, fmt.Errorf("%w: config groups %s and %s both target it with different settings", ErrMixed, best.Name, s.Name)
			}
		}
	}
	if best == nil {
		return nil, fmt.Errorf("%w: it is packed but no config group targets it", ErrInconsistent)
	}
	return best, nil
}
