package pipeline

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/ferry-llm/ferry/internal/errkind"
)

// Pipeline variables. A file declares its variables under a top-level
// vars: mapping, each with its default (a string, a list of strings, or
// nothing: then it must be given on the command line):
//
//	vars:
//	  BASE: ~/models/Qwen3.5-27B
//	  HOSTS: [studio-a, studio-b]
//	  ADAPTER:                      # no default: --var ADAPTER=DIR
//
// and refers to them as ${NAME} inside scalar values anywhere else in the
// file ($${ is a literal ${). --var NAME=VALUE replaces a default; a list
// variable takes comma-separated values (--var HOSTS=mac1,mac2).
//
// Substitution happens after the YAML is parsed, in the values of scalar
// nodes, so a value can never add YAML structure (keys, lists, anchors):
// `${X}` with X = "a: b" is the string "a: b". A scalar that refers to a
// variable gets its type from its substituted text, quoted or not, so
// `bits: ${BITS}` and, in a flow mapping where YAML wants the quotes,
// { bits: "${BITS}" } are the integer 4 when BITS is "4". A list variable may appear only in an item of
// a list: the item is repeated once per value (`to: ["${HOSTS}:${DEST}"]`
// with two hosts is a list of two destinations). Every node keeps its line,
// so errors still point into the file. Variables reach stage keys only
// through the values they produce.
//
// Every reference must be declared and have a value, and every --var must
// name a declared variable: a typo is an error before anything runs, not a
// default silently used.

var varNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Var is a pipeline variable and the value a run uses.
type Var struct {
	Name   string   `json:"name"`
	Value  []string `json:"value"` // one item unless List
	List   bool     `json:"list,omitempty"`
	Source string   `json:"source"` // "default" or "--var"
	Line   int      `json:"line"`   // of its declaration
}

// String is the value as --var takes it.
func (v Var) String() string { return strings.Join(v.Value, ",") }

// WithVars sets variables as --var KEY=VALUE does (a list variable's value
// is split at commas).
func WithVars(vars map[string]string) LoadOption {
	return func(o *loadOptions) { o.vars = vars }
}

// ParseVarFlag splits one --var argument, KEY=VALUE.
func ParseVarFlag(s string) (string, string, error) {
	k, v, ok := strings.Cut(s, "=")
	if !ok || !varNameRE.MatchString(k) {
		return "", "", errkind.Errorf(errkind.Usage, "--var %q: want NAME=VALUE, NAME of letters, digits and '_'", s)
	}
	return k, v, nil
}

// readVars reads the vars: mapping (nil when the file has none) and applies
// the command line's values, refusing one the file does not declare.
func readVars(name string, n *yaml.Node, given map[string]string) (map[string]*Var, error) {
	fail := func(line int, format string, args ...any) error {
		return &SpecError{File: name, Line: line, Msg: fmt.Sprintf(format, args...)}
	}
	vars := map[string]*Var{}
	if n != nil {
		if n.Kind != yaml.MappingNode {
			return nil, fail(n.Line, "vars must be a mapping of NAME: default")
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if !varNameRE.MatchString(k.Value) || k.Kind != yaml.ScalarNode {
				return nil, fail(k.Line, "variable name %q: want letters, digits and '_', not starting with a digit", k.Value)
			}
			if prev := vars[k.Value]; prev != nil {
				return nil, fail(k.Line, "variable %s declared twice (first at line %d)", k.Value, prev.Line)
			}
			vr := &Var{Name: k.Value, Line: k.Line, Source: "default"}
			switch {
			case v.Kind == yaml.ScalarNode && v.Tag == "!!null":
				vr.Value = nil // no default
			case v.Kind == yaml.ScalarNode:
				vr.Value = []string{v.Value}
			case v.Kind == yaml.SequenceNode:
				vr.List = true
				for _, c := range v.Content {
					if c.Kind != yaml.ScalarNode || c.Value == "" {
						return nil, fail(c.Line, "variable %s: every item of a list default must be a non-empty string", k.Value)
					}
					vr.Value = append(vr.Value, c.Value)
				}
				if len(vr.Value) == 0 {
					vr.Value = nil // [] : no default
				}
			default:
				return nil, fail(v.Line, "variable %s: a default is a string or a list of strings", k.Value)
			}
			vars[k.Value] = vr
		}
	}
	var unknown []string
	for k := range given {
		if vars[k] == nil {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, errkind.Errorf(errkind.Usage, "--var %s: %s declares no such variable (declared: %s)",
			strings.Join(unknown, ", "), name, declared(vars))
	}
	for k, s := range given {
		vr := vars[k]
		vr.Source = "--var"
		if !vr.List {
			vr.Value = []string{s}
			continue
		}
		vr.Value = nil
		for _, item := range strings.Split(s, ",") {
			if item = strings.TrimSpace(item); item == "" {
				return nil, errkind.Errorf(errkind.Usage, "--var %s=%q: %s is a list variable (line %d): give comma-separated non-empty values", k, s, k, vr.Line)
			}
			vr.Value = append(vr.Value, item)
		}
	}
	return vars, nil
}

func declared(vars map[string]*Var) string {
	if len(vars) == 0 {
		return "none; a file declares its variables under vars:"
	}
	names := make([]string, 0, len(vars))
	for k := range vars {
		names = append(names, k)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// varSubst substitutes variables in a parsed document.
type varSubst struct {
	file  string
	vars  map[string]*Var
	used  map[string]bool
	total int // bytes substituted so far
}

// node substitutes in n and everything under it. Aliases are not followed:
// the node they name is substituted where it is defined.
func (s *varSubst) node(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		out, err := s.expand(n, false)
		if err != nil {
			return err
		}
		s.set(n, out[0])
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if k := n.Content[i]; k.Kind == yaml.ScalarNode && strings.Contains(k.Value, "${") {
				return &SpecError{File: s.file, Line: k.Line, Msg: fmt.Sprintf("key %q: variables are substituted in values only, not in keys", k.Value)}
			}
			if err := s.node(n.Content[i+1]); err != nil {
				return err
			}
		}
	case yaml.SequenceNode:
		var items []*yaml.Node
		for _, c := range n.Content {
			if c.Kind != yaml.ScalarNode {
				if err := s.node(c); err != nil {
					return err
				}
				items = append(items, c)
				continue
			}
			out, err := s.expand(c, true)
			if err != nil {
				return err
			}
			if len(out) == 1 { // the node itself: an alias may name it
				s.set(c, out[0])
				items = append(items, c)
				continue
			}
			for _, v := range out {
				cc := *c
				s.set(&cc, v)
				items = append(items, &cc)
			}
		}
		n.Content = items
	}
	return nil
}

// set gives scalar n the value v. A scalar whose text changed has its type
// resolved again from the new text, quoted or not (in a flow mapping, {
// bits: "${BITS}" } must be quoted for YAML's sake, and is still the
// integer 4); an explicit tag (!!str "${X}") is kept.
func (s *varSubst) set(n *yaml.Node, v string) {
	if v == n.Value {
		return
	}
	n.Value = v
	if n.Style&yaml.TaggedStyle == 0 {
		n.Tag = ""
		n.Style &^= yaml.SingleQuotedStyle | yaml.DoubleQuotedStyle | yaml.LiteralStyle | yaml.FoldedStyle
	}
}

// maxExpansion bounds what substitution makes: the length of one value,
// and all substituted values of a file together (a list variable repeats
// items, which must not turn a small file into a huge one).
const (
	maxExpansion      = 1 << 16
	maxTotalExpansion = 8 << 20
)

// expand returns n's value with its references substituted: one string, or
// one per value of the list variable it refers to (inList: n is an item of
// a list, where that is allowed).
func (s *varSubst) expand(n *yaml.Node, inList bool) ([]string, error) {
	src := n.Value
	if !strings.Contains(src, "$") {
		return []string{src}, nil
	}
	fail := func(format string, args ...any) error {
		return &SpecError{File: s.file, Line: n.Line, Msg: fmt.Sprintf(format, args...)}
	}
	// Split src into literal text and references.
	type part struct {
		lit string
		ref *Var
	}
	var parts []part
	var list *Var
	var lit strings.Builder
	for i := 0; i < len(src); {
		switch {
		case strings.HasPrefix(src[i:], "$${"):
			lit.WriteString("${")
			i += 3
		case strings.HasPrefix(src[i:], "${"):
			end := strings.IndexByte(src[i:], '}')
			if end < 0 {
				return nil, fail("unterminated variable reference in %q (write $${ for a literal ${)", src)
			}
			name := src[i+2 : i+end]
			if !varNameRE.MatchString(name) {
				return nil, fail("bad variable reference ${%s} in %q: a name is letters, digits and '_'", name, src)
			}
			v := s.vars[name]
			switch {
			case v == nil:
				return nil, fail("variable ${%s} is not declared: add it under vars: (with a default, or empty to require --var %s=VALUE)", name, name)
			case v.Value == nil:
				return nil, fail("variable ${%s} is not set: give --var %s=VALUE (it has no default; declared at line %d)", name, name, v.Line)
			case v.List && !inList:
				return nil, fail("variable ${%s} is a list (line %d): use it in an item of a list, which then repeats once per value", name, v.Line)
			case v.List && list != nil && list != v:
				return nil, fail("%q uses two list variables (${%s}, ${%s}): one per item", src, list.Name, name)
			case v.List:
				list = v
			}
			s.used[name] = true
			parts = append(parts, part{lit: lit.String()}, part{ref: v})
			lit.Reset()
			i += end + 1
		default:
			lit.WriteByte(src[i])
			i++
		}
	}
	parts = append(parts, part{lit: lit.String()})
	n1 := 1
	if list != nil {
		n1 = len(list.Value)
	}
	out := make([]string, n1)
	for j := range out {
		var b strings.Builder
		for _, p := range parts {
			switch {
			case p.ref == nil:
				b.WriteString(p.lit)
			case p.ref.List:
				b.WriteString(p.ref.Value[j])
			default:
				b.WriteString(p.ref.Value[0])
			}
			if b.Len() > maxExpansion {
				return nil, fail("%q is over %d bytes once its variables are substituted", src, maxExpansion)
			}
		}
		out[j] = b.String()
		if s.total += b.Len() + 16; s.total > maxTotalExpansion {
			return nil, fail("substituting variables makes the file's values over %d bytes", maxTotalExpansion)
		}
	}
	return out, nil
}

// sortedVars lists vars by name.
func sortedVars(vars map[string]*Var) []Var {
	out := make([]Var, 0, len(vars))
	for _, v := range vars {
		out = append(out, *v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
