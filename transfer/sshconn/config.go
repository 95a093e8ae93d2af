package sshconn

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"unicode"

	"github.com/ferry-llm/ferry/internal/inputerr"
)

// The parser's bounds: an ssh_config is a few kilobytes; these are far
// above any real one and keep a hostile or broken file from costing more.
const (
	maxConfigSize   = 1 << 20 // bytes per file
	maxLineLen      = 16 << 10
	maxArgs         = 256    // arguments on one line
	maxIncludeDepth = 16     // OpenSSH's READCONF_MAX_DEPTH
	maxConfigFiles  = 256    // files read in all, through Include
	maxConfigLines  = 100000 // lines with a keyword, in all files
	maxJumps        = 16     // hosts in one ProxyJump list
)

// Config is a parsed ssh_config: its lines in order, Include expanded in
// place. Resolve walks it for one host with OpenSSH's rule: for each
// keyword the first value obtained wins (IdentityFile and the other
// list keywords accumulate).
type Config struct {
	lines []configLine
	// Files are the files read, the top one first.
	Files []string
}

type configLine struct {
	file string
	line int
	key  string // lower case
	args []string
	// section is the Host or Match line this line is under (-1: before
	// any, so it applies to every host).
	section int
	// depth-first include path: an included file's lines sit under the
	// section of its Include line as well as their own.
	parent int
}

// ErrConfig is wrapped by every ssh_config syntax error.
var ErrConfig = errors.New("ssh_config")

// ParseConfig parses an ssh_config read from r (named name in errors).
// Include lines are resolved against home/.ssh for relative paths when
// user is true (a user's config), /etc/ssh otherwise, as OpenSSH does.
func ParseConfig(r io.Reader, name, home string, user bool) (*Config, error) {
	return parseConfig(r, name, home, user, true)
}

// parseConfig is ParseConfig; with follow false, Include lines are kept
// but not read (the fuzz target's parser must not wander the disk).
func parseConfig(r io.Reader, name, home string, user, follow bool) (*Config, error) {
	c := &Config{}
	p := parser{c: c, home: home, user: user, noFollow: !follow}
	if err := p.parse(r, name, 0, -1); err != nil {
		return nil, err
	}
	return c, nil
}

// LoadConfig parses the file at path; a missing file is an empty config
// when missingOK.
func LoadConfig(path, home string, user, missingOK bool) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		if missingOK && errors.Is(err, os.ErrNotExist) {
			return &Config{}, nil
		}
		return nil, err
	}
	defer f.Close()
	return ParseConfig(f, path, home, user)
}

type parser struct {
	c        *Config
	home     string
	user     bool
	noFollow bool
	files    int
}

func (p *parser) errorf(file string, line int, format string, args ...any) error {
	return inputerr.Wrap(file, fmt.Errorf("line %d: %w: %s", line, ErrConfig, fmt.Sprintf(format, args...)))
}

// parse appends r's lines; parent is the index of the Include line's
// section (-1 at top level).
func (p *parser) parse(r io.Reader, name string, depth, parent int) error {
	p.files++
	if p.files > maxConfigFiles {
		return p.errorf(name, 0, "more than %d files through Include", maxConfigFiles)
	}
	p.c.Files = append(p.c.Files, name)
	data, err := io.ReadAll(io.LimitReader(r, maxConfigSize+1))
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if len(data) > maxConfigSize {
		return p.errorf(name, 0, "larger than %d bytes", maxConfigSize)
	}
	section := parent
	for n, text := range strings.Split(string(data), "\n") {
		lineNo := n + 1
		if len(p.c.lines) >= maxConfigLines {
			return p.errorf(name, lineNo, "more than %d lines in all", maxConfigLines)
		}
		if len(text) > maxLineLen {
			return p.errorf(name, lineNo, "line longer than %d bytes", maxLineLen)
		}
		key, args, err := splitConfigLine(text)
		if err != nil {
			return p.errorf(name, lineNo, "%v", err)
		}
		if key == "" {
			continue
		}
		cl := configLine{file: name, line: lineNo, key: key, args: args, section: section, parent: parent}
		switch key {
		case "host", "match":
			if len(args) == 0 {
				return p.errorf(name, lineNo, "%s needs an argument", key)
			}
			cl.section = len(p.c.lines)
			p.c.lines = append(p.c.lines, cl)
			section = cl.section
			continue
		case "include":
			if len(args) == 0 {
				return p.errorf(name, lineNo, "Include needs a file")
			}
			if depth+1 > maxIncludeDepth {
				return p.errorf(name, lineNo, "Include nested deeper than %d", maxIncludeDepth)
			}
			// The included lines sit under this line's section; an
			// included Host line starts a section that ends with its file.
			p.c.lines = append(p.c.lines, cl)
			incSection := len(p.c.lines) - 1
			for _, pat := range args {
				if p.noFollow {
					break
				}
				if err := p.include(pat, name, lineNo, depth, incSection); err != nil {
					return err
				}
			}
			continue
		}
		p.c.lines = append(p.c.lines, cl)
	}
	return nil
}

func (p *parser) include(pat, from string, lineNo, depth, section int) error {
	pat = expandTilde(pat, p.home)
	if !filepath.IsAbs(pat) {
		if p.user {
			pat = filepath.Join(p.home, ".ssh", pat)
		} else {
			pat = filepath.Join("/etc/ssh", pat)
		}
	}
	matches, err := filepath.Glob(pat)
	if err != nil {
		return p.errorf(from, lineNo, "Include %s: %v", pat, err)
	}
	// A pattern that matches nothing is not an error (OpenSSH agrees).
	for _, m := range matches {
		f, err := os.Open(m)
		if err != nil {
			return p.errorf(from, lineNo, "Include %s: %v", m, err)
		}
		fi, err := f.Stat()
		if err == nil && fi.IsDir() {
			f.Close()
			continue
		}
		err = p.parse(f, m, depth+1, section)
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// splitConfigLine splits one line into its lower-cased keyword and its
// arguments: words separated by blanks, "double quotes" grouping, an
// optional = after the keyword, and # starting a comment at the start of
// a word.
func splitConfigLine(s string) (key string, args []string, err error) {
	s = strings.TrimRightFunc(s, unicode.IsSpace)
	var words []string
	i := 0
	for i < len(s) {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
			i++
		}
		if i >= len(s) || s[i] == '#' {
			break
		}
		if len(words) == 1 && s[i] == '=' && !strings.Contains(words[0], "=") {
			i++
			continue
		}
		var w strings.Builder
		quoted := false
		for i < len(s) {
			ch := s[i]
			if ch == '"' {
				quoted = !quoted
				i++
				continue
			}
			if !quoted && (ch == ' ' || ch == '\t') {
				break
			}
			if !quoted && len(words) == 0 && ch == '=' {
				break
			}
			if ch == '\\' && i+1 < len(s) && (s[i+1] == '"' || s[i+1] == '\\') {
				i++
				ch = s[i]
			}
			w.WriteByte(ch)
			i++
		}
		if quoted {
			return "", nil, errors.New("unterminated quote")
		}
		words = append(words, w.String())
		if len(words) > maxArgs+1 {
			return "", nil, fmt.Errorf("more than %d arguments", maxArgs)
		}
		if len(words) == 1 && i < len(s) && s[i] == '=' {
			i++
		}
	}
	if len(words) == 0 {
		return "", nil, nil
	}
	return strings.ToLower(words[0]), words[1:], nil
}

// expandTilde replaces a leading ~ or ~/ with home.
func expandTilde(p, home string) string {
	if p == "~" {
		return home
	}
	if strings.HasPrefix(p, "~/") {
		return filepath.Join(home, p[2:])
	}
	return p
}

// matchPattern matches s against an ssh_config pattern: * any run, ? one
// character; case-insensitive like OpenSSH's host matching.
func matchPattern(pat, s string) bool {
	pat, s = strings.ToLower(pat), strings.ToLower(s)
	// Iterative glob with one backtrack point: linear in practice, no
	// recursion to blow up on many stars.
	pi, si, star, mark := 0, 0, -1, 0
	for si < len(s) {
		switch {
		case pi < len(pat) && (pat[pi] == '?' || pat[pi] == s[si]):
			pi++
			si++
		case pi < len(pat) && pat[pi] == '*':
			star, mark = pi, si
			pi++
		case star >= 0:
			pi = star + 1
			mark++
			si = mark
		default:
			return false
		}
	}
	for pi < len(pat) && pat[pi] == '*' {
		pi++
	}
	return pi == len(pat)
}

// matchList matches s against patterns (! negates one): true when a
// positive pattern matches and no negated one does. Host takes its
// patterns as words, Match criteria as a comma-separated list.
func matchList(patterns []string, s string) bool {
	matched := false
	for _, pat := range patterns {
		if pat == "" {
			continue
		}
		if neg, ok := strings.CutPrefix(pat, "!"); ok {
			if matchPattern(neg, s) {
				return false
			}
			continue
		}
		if matchPattern(pat, s) {
			matched = true
		}
	}
	return matched
}
