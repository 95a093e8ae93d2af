// Package pipeline reads pipeline files (a named list of stages, each one
// kind with parameters, referring to earlier stages by name), checks them,
// and runs, plans and reports them against a manifest.Store.
package pipeline

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/s3client"

	"gopkg.in/yaml.v3"
)

// maxSpecSize bounds a pipeline file before it is read.
const maxSpecSize = 1 << 20

// Spec is a parsed, checked pipeline file.
type Spec struct {
	Name string
	File string // absolute path of the file
	Dir  string // its directory: relative paths start here
	// Store is the absolute directory of the local store: the store
	// itself, or, when Shared is set, this machine's cache of it (views,
	// work dirs, resume journals, blobs fetched or made here).
	Store string
	// Shared is the store several machines share ("s3://BUCKET/PREFIX",
	// or "file:///DIR" on a file system they all mount), "" for a
	// pipeline on a local store only.
	Shared string
	// LeaseTTL is the pipeline file's lease_ttl (0: the default).
	LeaseTTL time.Duration
	// CacheMax is the pipeline file's cache_max in bytes (0: no bound).
	CacheMax int64
	Stages   []*StageSpec
	// Kinds are the stage kinds the file was parsed with; runs use them.
	Kinds *Kinds
	// Vars are the file's variables with the values this parse used.
	Vars   []Var
	byName map[string]*StageSpec
}

// StageSpec is one stage of a Spec.
type StageSpec struct {
	Name  string
	Kind  string
	Line  int    // line of the stage's list item
	Out   string // absolute view directory ("" = <store>/views/<name>)
	Stage Stage  // nil when the kind is not built yet
	Deps  []Ref  // stages it reads, in order
	index int
	// outLine is the line of out: (of the stage item when there is none).
	outLine int
}

// KindOf returns the kind of stage st.
func (s *Spec) KindOf(st *StageSpec) Kind {
	k, _ := s.Kinds.Lookup(st.Kind)
	return k
}

// Lookup returns the stage called name, or nil.
func (s *Spec) Lookup(name string) *StageSpec { return s.byName[name] }

// DefaultCache is the local cache of the shared store url when no --cache
// is given: a directory of its own under the user cache directory
// (~/.cache/ferry/stores/… on Linux, ~/Library/Caches/ferry/stores/… on a
// Mac), named after the url so two buckets never share one.
func DefaultCache(url string) (string, error) {
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no user cache directory for its local cache (give --cache DIR): %w", err)
	}
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			return r
		}
		return '_'
	}, strings.TrimLeft(strings.TrimPrefix(strings.TrimPrefix(url, "s3://"), "file://"), "/"))
	if len(name) > 64 {
		name = name[:64]
	}
	sum := sha256.Sum256([]byte(url))
	return filepath.Join(d, "ferry", "stores", name+"-"+hex.EncodeToString(sum[:6])), nil
}

// UseCache makes dir the local cache of a pipeline on a shared store
// (ferry pipeline run --cache); a usage error for a pipeline whose store
// is a directory.
func (s *Spec) UseCache(dir string) error {
	if s.Shared == "" {
		return errkind.Errorf(errkind.Usage, "--cache %s: the store of %s is the directory %s, which needs no cache (--cache is for store: s3://…)", dir, s.File, s.Store)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	s.Store = abs
	return nil
}

// ViewDir is where the stage's outputs appear.
func (s *Spec) ViewDir(st *StageSpec) string {
	if st.Out != "" {
		return st.Out
	}
	return filepath.Join(s.Store, "views", st.Name)
}

var stageNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

// LoadOption changes how a pipeline file is read.
type LoadOption func(*loadOptions)

type loadOptions struct {
	kinds *Kinds
	vars  map[string]string
}

// WithKinds parses the file against kinds instead of BuiltinKinds (tests
// add the synth kind of pipeline/pipelinetest this way).
func WithKinds(kinds *Kinds) LoadOption {
	return func(o *loadOptions) { o.kinds = kinds }
}

// Load reads and checks the pipeline file at path.
func Load(path string, opts ...LoadOption) (*Spec, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(abs)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSpecSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxSpecSize {
		return nil, &SpecError{File: path, Msg: fmt.Sprintf("file is over %d bytes", maxSpecSize)}
	}
	return Parse(path, filepath.Dir(abs), b, opts...)
}

var yamlErrRE = regexp.MustCompile(`(?s)^(?:yaml: )?(?:line (\d+):)?(.*)$`)

// Parse checks a pipeline file's content. name is used in error messages;
// dir is the directory relative paths start from.
func Parse(name, dir string, b []byte, opts ...LoadOption) (*Spec, error) {
	o := loadOptions{}
	for _, f := range opts {
		f(&o)
	}
	if o.kinds == nil {
		o.kinds = BuiltinKinds()
	}
	fail := func(line int, format string, args ...any) error {
		return &SpecError{File: name, Line: line, Msg: fmt.Sprintf(format, args...)}
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		line, msg := yamlMessage(err)
		if l := yamlErrorLine(b, msg); l > 0 {
			line = l
		}
		if line == 0 {
			line = 1
		}
		return nil, fail(line, "invalid YAML: %s", msg)
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, fail(1, "empty file: expected name, store and stages")
	}
	if len(doc.Content) > 1 {
		return nil, fail(doc.Content[1].Line, "more than one YAML document")
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fail(root.Line, "the file must be a mapping with name, store and stages")
	}
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	spec := &Spec{File: filepath.Join(absDir, filepath.Base(name)), Dir: absDir, Kinds: o.kinds, byName: map[string]*StageSpec{}}
	var stagesNode *yaml.Node
	seen := map[string]int{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k := root.Content[i]
		if l, dup := seen[k.Value]; dup {
			return nil, fail(k.Line, "%q given twice (first at line %d)", k.Value, l)
		}
		seen[k.Value] = k.Line
	}
	// Variables first: they are substituted in every other value.
	var varsNode *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "vars" {
			varsNode = root.Content[i+1]
		}
	}
	vars, err := readVars(name, varsNode, o.vars)
	if err != nil {
		return nil, err
	}
	sub := &varSubst{file: name, vars: vars, used: map[string]bool{}}
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value != "vars" {
			if err := sub.node(root.Content[i+1]); err != nil {
				return nil, err
			}
		}
	}
	spec.Vars = sortedVars(vars)
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		switch k.Value {
		case "vars": // read above
		case "name":
			if v.Kind != yaml.ScalarNode || !stageNameRE.MatchString(v.Value) {
				return nil, fail(v.Line, "name must be a word of letters, digits, '_', '-' or '.'")
			}
			spec.Name = v.Value
		case "store":
			if v.Kind != yaml.ScalarNode || v.Value == "" {
				return nil, fail(v.Line, "store must be a directory path or s3://BUCKET/PREFIX")
			}
			if scheme, _, ok := strings.Cut(v.Value, "://"); ok && !strings.Contains(scheme, "/") {
				switch scheme {
				case "s3":
					if _, _, err := s3client.ParseURL(v.Value); err != nil {
						return nil, fail(v.Line, "store: %v", err)
					}
				case "file":
					// A shared store in a directory every machine mounts.
					if p := strings.TrimPrefix(v.Value, "file://"); !filepath.IsAbs(p) || filepath.Clean(p) != p {
						return nil, fail(v.Line, "store %s: want file:///ABSOLUTE/DIR (a clean absolute path)", v.Value)
					}
				default:
					return nil, fmt.Errorf("%s:%d: store %s: a pipeline on a %s:// store is %w (only s3://BUCKET/PREFIX, file:///DIR and directories)",
						name, v.Line, v.Value, scheme, errkind.ErrNotBuilt)
				}
				cache, err := DefaultCache(v.Value)
				if err != nil {
					return nil, fail(v.Line, "store %s: %v", v.Value, err)
				}
				spec.Shared, spec.Store = v.Value, cache
				break
			}
			p, err := ResolvePath(absDir, v.Value)
			if err != nil {
				return nil, fail(v.Line, "store: %v", err)
			}
			spec.Store = p
		case "cache_max":
			n, ok := ParseSize(v.Value)
			if v.Kind != yaml.ScalarNode || !ok || n <= 0 {
				return nil, fail(v.Line, "cache_max must be a size like 200GB or 1TiB")
			}
			spec.CacheMax = n
		case "lease_ttl":
			d, err := time.ParseDuration(v.Value)
			if v.Kind != yaml.ScalarNode || err != nil || d < 100*time.Millisecond {
				return nil, fail(v.Line, "lease_ttl must be a duration of at least 100ms, like 2m or 30s")
			}
			spec.LeaseTTL = d
		case "stages":
			if v.Kind != yaml.SequenceNode {
				return nil, fail(v.Line, "stages must be a list")
			}
			stagesNode = v
		default:
			return nil, fail(k.Line, "unknown key %q (expected name, store, lease_ttl, cache_max, vars, stages)", k.Value)
		}
	}
	if spec.Name == "" {
		return nil, fail(root.Line, "missing name")
	}
	if spec.Store == "" {
		spec.Store = filepath.Join(absDir, ".ferry")
	}
	if stagesNode == nil || len(stagesNode.Content) == 0 {
		line := root.Line
		if stagesNode != nil {
			line = stagesNode.Line
		}
		return nil, fail(line, "no stages")
	}
	for _, n := range stagesNode.Content {
		st, err := parseStage(name, absDir, n, o.kinds)
		if err != nil {
			return nil, err
		}
		if prev, dup := spec.byName[st.Name]; dup {
			return nil, &SpecError{File: name, Line: st.Line, Stage: st.Name,
				Msg: fmt.Sprintf("duplicate stage name (first defined at line %d)", prev.Line)}
		}
		st.index = len(spec.Stages)
		spec.Stages = append(spec.Stages, st)
		spec.byName[st.Name] = st
	}
	for _, st := range spec.Stages {
		for _, r := range st.Deps {
			if spec.byName[r.Name] == nil {
				return nil, &SpecError{File: name, Line: r.Line, Stage: st.Name,
					Msg: fmt.Sprintf("refers to unknown stage %q", r.Name)}
			}
		}
	}
	if err := spec.checkCycles(name); err != nil {
		return nil, err
	}
	// A view directory belongs to one stage: making a view drops the ferry
	// links that stage does not own, so views must not share or nest.
	within := func(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+string(filepath.Separator)) }
	for i, a := range spec.Stages {
		if a.Out != "" && (within(spec.Store, a.Out) || within(a.Out, spec.Store)) {
			return nil, &SpecError{File: name, Line: a.outLine, Stage: a.Name,
				Msg: fmt.Sprintf("out %s overlaps the store %s", a.Out, spec.Store)}
		}
		for _, b := range spec.Stages[:i] {
			va, vb := spec.ViewDir(a), spec.ViewDir(b)
			if va == vb || strings.HasPrefix(va, vb+string(filepath.Separator)) || strings.HasPrefix(vb, va+string(filepath.Separator)) {
				return nil, &SpecError{File: name, Line: a.outLine, Stage: a.Name,
					Msg: fmt.Sprintf("out %s overlaps the view of stage %q (%s)", va, b.Name, vb)}
			}
		}
	}
	return spec, nil
}

func parseStage(file, dir string, n *yaml.Node, kinds *Kinds) (*StageSpec, error) {
	if n.Kind != yaml.MappingNode {
		return nil, &SpecError{File: file, Line: n.Line, Msg: "a stage must be a mapping with name, one kind and optional out"}
	}
	st := &StageSpec{Line: n.Line, outLine: n.Line}
	var kindKey, kindVal *yaml.Node
	var outNode *yaml.Node
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if l, dup := seen[k.Value]; dup {
			return nil, &SpecError{File: file, Line: k.Line, Msg: fmt.Sprintf("%q given twice in one stage (first at line %d)", k.Value, l)}
		}
		seen[k.Value] = k.Line
		switch k.Value {
		case "name":
			if v.Kind != yaml.ScalarNode || !stageNameRE.MatchString(v.Value) {
				return nil, &SpecError{File: file, Line: v.Line, Msg: "stage name must be a word of letters, digits, '_', '-' or '.'"}
			}
			st.Name = v.Value
		case "out":
			outNode = v
			st.outLine = k.Line
		default:
			if kindKey != nil {
				return nil, &SpecError{File: file, Line: k.Line,
					Msg: fmt.Sprintf("a stage has exactly one kind, but this one has %q (line %d) and %q", kindKey.Value, kindKey.Line, k.Value)}
			}
			kindKey, kindVal = k, v
		}
	}
	if st.Name == "" {
		return nil, &SpecError{File: file, Line: n.Line, Msg: "stage without a name"}
	}
	if kindKey == nil {
		return nil, &SpecError{File: file, Line: n.Line, Stage: st.Name,
			Msg: fmt.Sprintf("no kind given (one of %s)", strings.Join(kinds.Names(), ", "))}
	}
	st.Kind = kindKey.Value
	kind, ok := kinds.Lookup(st.Kind)
	if !ok {
		return nil, &SpecError{File: file, Line: kindKey.Line, Stage: st.Name,
			Msg: fmt.Sprintf("unknown kind %q (known: %s)", st.Kind, strings.Join(kinds.Names(), ", "))}
	}
	if outNode != nil {
		if outNode.Kind != yaml.ScalarNode || outNode.Value == "" {
			return nil, &SpecError{File: file, Line: outNode.Line, Stage: st.Name, Msg: "out must be a directory path"}
		}
		p, err := ResolvePath(dir, outNode.Value)
		if err != nil {
			return nil, &SpecError{File: file, Line: outNode.Line, Stage: st.Name, Msg: err.Error()}
		}
		st.Out = p
	}
	p, err := newParams(file, dir, st.Name, st.Kind, kindVal)
	if err != nil {
		return nil, err
	}
	if kind.Built() {
		s, err := kind.New(p)
		if err != nil {
			var se *SpecError
			if errors.Is(err, errkind.ErrNotBuilt) {
				return nil, err // a parameter value asks for what is not built: said with its line
			}
			if !errors.As(err, &se) {
				err = &SpecError{File: file, Line: p.line, Stage: st.Name, Msg: err.Error()}
			}
			return nil, err
		}
		st.Stage = s
	} else {
		for _, k := range kind.RefKeys {
			if _, err := p.Refs(k, false); err != nil {
				return nil, err
			}
		}
		p.IgnoreAll()
	}
	if err := p.unused(); err != nil {
		return nil, err
	}
	st.Deps = p.refs
	return st, nil
}

// checkCycles reports the first dependency cycle, at the line of the stage
// that closes it.
func (s *Spec) checkCycles(file string) error {
	const (
		white = iota
		grey
		black
	)
	color := map[string]int{}
	var stack []string
	var visit func(st *StageSpec) error
	visit = func(st *StageSpec) error {
		color[st.Name] = grey
		stack = append(stack, st.Name)
		for _, r := range st.Deps {
			switch color[r.Name] {
			case grey:
				i := len(stack) - 1
				for stack[i] != r.Name {
					i--
				}
				cyc := append(append([]string(nil), stack[i:]...), r.Name)
				return &SpecError{File: file, Line: r.Line, Stage: st.Name,
					Msg: "dependency cycle: " + strings.Join(cyc, " -> ")}
			case white:
				if err := visit(s.byName[r.Name]); err != nil {
					return err
				}
			}
		}
		stack = stack[:len(stack)-1]
		color[st.Name] = black
		return nil
	}
	for _, st := range s.Stages {
		if color[st.Name] == white {
			if err := visit(st); err != nil {
				return err
			}
		}
	}
	return nil
}

// Order returns the stages in a dependency order (file order where free).
func (s *Spec) Order() []*StageSpec {
	done := map[string]bool{}
	var out []*StageSpec
	var add func(st *StageSpec)
	add = func(st *StageSpec) {
		if done[st.Name] {
			return
		}
		done[st.Name] = true
		for _, r := range st.Deps {
			add(s.byName[r.Name])
		}
		out = append(out, st)
	}
	for _, st := range s.Stages {
		add(st)
	}
	return out
}

// Dependents returns name and every stage that depends on it, transitively.
func (s *Spec) Dependents(name string) map[string]bool {
	set := map[string]bool{name: true}
	for changed := true; changed; {
		changed = false
		for _, st := range s.Stages {
			if set[st.Name] {
				continue
			}
			for _, r := range st.Deps {
				if set[r.Name] {
					set[st.Name] = true
					changed = true
					break
				}
			}
		}
	}
	return set
}

// yamlMessage splits a yaml.v3 error into the line its text names (0 when
// none) and what is wrong. yaml.v3 has no error type for syntax errors: the
// position exists only in the text ("yaml: line 3: did not find expected
// key"), so this is the one place that reads it out of a message.
func yamlMessage(err error) (int, string) {
	m := yamlErrRE.FindStringSubmatch(err.Error())
	line, _ := strconv.Atoi(m[1])
	return line, strings.TrimSpace(m[2])
}

// yamlErrorLine finds the line a YAML syntax error is on. yaml.v3 reports
// the line where the enclosing construct began (often lines earlier), so
// this looks for the shortest prefix of the file, in whole lines, that fails
// with the same message: the line where the problem becomes visible.
// It gives 0 when it cannot tell (or the file is too big to search).
func yamlErrorLine(b []byte, msg string) int {
	lines := strings.SplitAfter(string(b), "\n")
	if len(lines) > 500 || len(b) > 64<<10 { // bounded work: pipeline files are small
		return 0
	}
	var prefix strings.Builder
	for i, l := range lines {
		prefix.WriteString(l)
		var n yaml.Node
		err := yaml.Unmarshal([]byte(prefix.String()), &n)
		if err == nil {
			continue
		}
		if _, m := yamlMessage(err); m == msg {
			return i + 1
		}
	}
	return 0
}
