package pipeline

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Params gives a stage kind typed access to its parameters (the mapping
// under the kind key), with the YAML line in every error. Keys a kind never
// asks for are errors (a typo must not be silently ignored).
type Params struct {
	file  string
	dir   string
	stage string
	kind  string
	line  int
	keys  map[string]*yaml.Node // key → value node
	klin  map[string]int        // key → line of the key
	used  map[string]bool
	refs  []Ref
}

// Ref is a reference to another stage by name, with the line it is on.
type Ref struct {
	Name string
	Line int
}

func newParams(file, dir, stage, kind string, n *yaml.Node) (*Params, error) {
	p := &Params{file: file, dir: dir, stage: stage, kind: kind, line: n.Line,
		keys: map[string]*yaml.Node{}, klin: map[string]int{}, used: map[string]bool{}}
	switch {
	case n.Kind == yaml.ScalarNode && (n.Tag == "!!null" || n.Value == ""):
		return p, nil // `import:` with nothing, checked by the kind
	case n.Kind != yaml.MappingNode:
		return nil, p.errAt(n.Line, "parameters of %s must be a mapping like { key: value }", kind)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if _, dup := p.keys[k.Value]; dup {
			return nil, p.errAt(k.Line, "parameter %q given twice", k.Value)
		}
		p.keys[k.Value] = v
		p.klin[k.Value] = k.Line
	}
	return p, nil
}

// Stage is the name of the stage being parsed.
func (p *Params) Stage() string { return p.stage }

// Line is the line of the kind key.
func (p *Params) Line() int { return p.line }

// Dir is the directory of the pipeline file (relative paths start there).
func (p *Params) Dir() string { return p.dir }

func (p *Params) errAt(line int, format string, args ...any) error {
	return &SpecError{File: p.file, Line: line, Stage: p.stage, Msg: fmt.Sprintf(format, args...)}
}

// Errorf makes an error at the line of key (or of the kind if key is absent).
func (p *Params) Errorf(key, format string, args ...any) error {
	line := p.line
	if l, ok := p.klin[key]; ok {
		line = l
	}
	return p.errAt(line, "%s.%s: %s", p.kind, key, fmt.Sprintf(format, args...))
}

// Has reports whether key is given.
func (p *Params) Has(key string) bool { _, ok := p.keys[key]; return ok }

func (p *Params) node(key string, required bool) (*yaml.Node, error) {
	p.used[key] = true
	n, ok := p.keys[key]
	if !ok {
		if required {
			return nil, p.errAt(p.line, "%s needs %q", p.kind, key)
		}
		return nil, nil
	}
	return n, nil
}

// String returns a scalar string parameter ("" if absent and not required).
func (p *Params) String(key string, required bool) (string, error) {
	n, err := p.node(key, required)
	if n == nil || err != nil {
		return "", err
	}
	if n.Kind != yaml.ScalarNode {
		return "", p.Errorf(key, "must be a single value")
	}
	if required && n.Value == "" {
		return "", p.Errorf(key, "must not be empty")
	}
	return n.Value, nil
}

// Path returns a path parameter made absolute: "~" expands to the home
// directory, and a relative path is relative to the pipeline file.
func (p *Params) Path(key string, required bool) (string, error) {
	s, err := p.String(key, required)
	if s == "" || err != nil {
		return s, err
	}
	abs, err := ResolvePath(p.dir, s)
	if err != nil {
		return "", p.Errorf(key, "%v", err)
	}
	return abs, nil
}

// ResolvePath expands "~" and makes s absolute relative to dir.
func ResolvePath(dir, s string) (string, error) {
	if s == "~" || strings.HasPrefix(s, "~/") {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		s = filepath.Join(home, s[1:])
	}
	if !filepath.IsAbs(s) {
		s = filepath.Join(dir, s)
	}
	return filepath.Clean(s), nil
}

// Int returns an integer parameter, def if absent.
func (p *Params) Int(key string, def int64) (int64, error) {
	n, err := p.node(key, false)
	if n == nil || err != nil {
		return def, err
	}
	v, err := strconv.ParseInt(n.Value, 10, 64)
	if n.Kind != yaml.ScalarNode || err != nil {
		return 0, p.Errorf(key, "must be an integer, got %q", n.Value)
	}
	return v, nil
}

// Size returns a byte count parameter: an integer with an optional unit
// (KB, MB, GB are powers of 1000; KiB, MiB, GiB powers of 1024).
func (p *Params) Size(key string, def int64) (int64, error) {
	n, err := p.node(key, false)
	if n == nil || err != nil {
		return def, err
	}
	v, ok := ParseSize(n.Value)
	if n.Kind != yaml.ScalarNode || !ok {
		return 0, p.Errorf(key, "must be a size like 100MB or 1GiB, got %q", n.Value)
	}
	return v, nil
}

// ParseSize reads a byte count: an integer with an optional unit (KB, MB,
// GB are powers of 1000; KiB, MiB, GiB powers of 1024).
func ParseSize(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	units := []struct {
		suf string
		mul int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	mul := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suf) {
			s, mul = strings.TrimSpace(strings.TrimSuffix(s, u.suf)), u.mul
			break
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 || (v > 0 && mul > (1<<62)/v) {
		return 0, false
	}
	return v * mul, true
}

// Bool returns a boolean parameter, def if absent.
func (p *Params) Bool(key string, def bool) (bool, error) {
	n, err := p.node(key, false)
	if n == nil || err != nil {
		return def, err
	}
	var b bool
	if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
		return false, p.Errorf(key, "must be true or false, got %q", n.Value)
	}
	return b, nil
}

// Strings returns a parameter given as one string or a list of strings.
func (p *Params) Strings(key string, required bool) ([]string, error) {
	n, err := p.node(key, required)
	if n == nil || err != nil {
		return nil, err
	}
	return p.strings(key, n)
}

func (p *Params) strings(key string, n *yaml.Node) ([]string, error) {
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Value == "" {
			return nil, p.Errorf(key, "must not be empty")
		}
		return []string{n.Value}, nil
	case yaml.SequenceNode:
		var out []string
		for _, c := range n.Content {
			if c.Kind != yaml.ScalarNode || c.Value == "" {
				return nil, p.errAt(c.Line, "%s.%s: every item must be a non-empty string", p.kind, key)
			}
			out = append(out, c.Value)
		}
		if len(out) == 0 {
			return nil, p.Errorf(key, "must not be an empty list")
		}
		return out, nil
	}
	return nil, p.Errorf(key, "must be a string or a list of strings")
}

// Ref returns a reference to one earlier stage.
func (p *Params) Ref(key string, required bool) (string, error) {
	s, err := p.String(key, required)
	if s == "" || err != nil {
		return s, err
	}
	p.refs = append(p.refs, Ref{Name: s, Line: p.klin[key]})
	return s, nil
}

// Refs returns references to stages given as one name or a list.
func (p *Params) Refs(key string, required bool) ([]string, error) {
	n, err := p.node(key, required)
	if n == nil || err != nil {
		return nil, err
	}
	names, err := p.strings(key, n)
	if err != nil {
		return nil, err
	}
	for i, s := range names {
		line := n.Line
		if n.Kind == yaml.SequenceNode {
			line = n.Content[i].Line
		}
		p.refs = append(p.refs, Ref{Name: s, Line: line})
	}
	return names, nil
}

// Ignore marks keys as known without reading them (for kinds not built yet).
func (p *Params) Ignore(keys ...string) {
	for _, k := range keys {
		p.used[k] = true
	}
}

// IgnoreAll marks every key as known.
func (p *Params) IgnoreAll() {
	for k := range p.keys {
		p.used[k] = true
	}
}

// unused returns an error for the first key the kind did not read.
func (p *Params) unused() error {
	var bad []string
	for k := range p.keys {
		if !p.used[k] {
			bad = append(bad, k)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Slice(bad, func(i, j int) bool { return p.klin[bad[i]] < p.klin[bad[j]] })
	return p.errAt(p.klin[bad[0]], "unknown parameter %q for %s", bad[0], p.kind)
}
