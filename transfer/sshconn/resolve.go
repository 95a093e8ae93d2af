package sshconn

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/ferry-llm/ferry/internal/errkind"
)

// Endpoint is one SSH server as the user's ssh_config and the command
// line make it: where to connect, as whom, with which keys, checked
// against which known_hosts files, and through which jump hosts.
type Endpoint struct {
	Name     string // the host as the user named it (an alias, or an address)
	HostName string // the host to connect to (HostName, %h expanded), no brackets
	Port     int
	User     string

	IdentityFiles  []string // -i files, then IdentityFile lines; ~ and %-tokens expanded
	IdentitiesOnly bool     // only IdentityFiles, no other agent keys
	// IdentityAgent is the agent socket: SSH_AUTH_SOCK unless IdentityAgent
	// says otherwise; "" when none.
	IdentityAgent string

	KnownHostsFiles []string // user files (UserKnownHostsFile or --known-hosts), then global ones
	HostKeyAlias    string   // the name to look the host key up by, "" for HostName
	// StrictHostKeyChecking is the config's value, a hint only: ferry
	// always refuses an unknown host unless Options.AcceptNew, and always
	// refuses a changed key.
	StrictHostKeyChecking string
	HashKnownHosts        bool // write accepted keys hashed (|1|salt|hash)
	BatchMode             bool // never prompt

	ConnectTimeout      time.Duration // 0: Options.Timeout
	ServerAliveInterval time.Duration // 0: keepalive default
	ServerAliveCountMax int

	// Jumps are the ProxyJump hosts in order: the first is dialled
	// directly (through its own ProxyJump, if it has one), each next one
	// through the one before, and this host through the last.
	Jumps []*Endpoint

	// Warnings are config lines ferry read but does not act on (a Match
	// it cannot evaluate), for the caller to log.
	Warnings []string
}

// Addr is HostName:Port for dialling.
func (e *Endpoint) Addr() string { return hostPort(e.HostName, e.Port) }

// String is user@host:port as messages name the endpoint.
func (e *Endpoint) String() string {
	h := e.HostName
	if strings.Contains(h, ":") {
		h = "[" + h + "]"
	}
	s := fmt.Sprintf("%s@%s:%d", e.User, h, e.Port)
	if e.Name != "" && e.Name != e.HostName {
		s += " (" + e.Name + ")"
	}
	return s
}

// knownHostsName is the host as known_hosts names it: [host]:port unless
// the port is 22.
func (e *Endpoint) knownHostsName() string { return knownhosts.Normalize(e.lookupAddr()) }

// lookupAddr is host:port for the known_hosts callback.
func (e *Endpoint) lookupAddr() string {
	h := e.HostName
	if e.HostKeyAlias != "" {
		h = e.HostKeyAlias
	}
	return hostPort(h, e.Port)
}

// maxJumpDepth bounds ProxyJump recursion (a jump whose own config names
// a jump …): a loop in the config ends here with an error.
const maxJumpDepth = 8

// Resolve reads the ssh_config files Options names and returns the
// endpoint for t: t.User and t.Port override the config's, as on the ssh
// command line.
func Resolve(t Target, o Options) (*Endpoint, error) {
	d, err := NewDialer(o)
	if err != nil {
		return nil, err
	}
	return d.Resolve(t)
}

type resolver struct {
	o         Options
	configs   []*Config
	home      string
	localUser string
}

func newResolver(o Options) (*resolver, error) {
	r := &resolver{o: o}
	r.home, _ = os.UserHomeDir()
	if u, err := user.Current(); err == nil {
		r.localUser = u.Username
	} else {
		r.localUser = os.Getenv("USER")
	}
	switch o.SSHConfigPath {
	case "none":
	case "":
		// ssh reads ~/.ssh/config, then /etc/ssh/ssh_config; either may
		// be missing.
		uc, err := LoadConfig(filepath.Join(r.home, ".ssh", "config"), r.home, true, true)
		if err != nil {
			return nil, err
		}
		sc, err := LoadConfig(systemConfig, r.home, false, true)
		if err != nil {
			return nil, err
		}
		r.configs = []*Config{uc, sc}
	default:
		c, err := LoadConfig(expandTilde(o.SSHConfigPath, r.home), r.home, true, false)
		if err != nil {
			return nil, errkind.Mark(errkind.BadInput, fmt.Errorf("--ssh-config: %w", err))
		}
		r.configs = []*Config{c}
	}
	return r, nil
}

// systemConfig is OpenSSH's system-wide client configuration.
var systemConfig = "/etc/ssh/ssh_config"

// values are the first-obtained values of one host's keywords.
type values struct {
	first    map[string][]string // keyword → its arguments, the first line that set it
	where    map[string]string   // keyword → "file:line" of that line
	seq      map[string]int      // keyword → the order in which it was first set
	identity []string            // every IdentityFile, in order
	warnings []string
}

func (r *resolver) collect(host, remoteUser string) (*values, error) {
	v := &values{first: map[string][]string{}, where: map[string]string{}, seq: map[string]int{}}
	for _, c := range r.configs {
		act := make([]bool, len(c.lines))
		for i, l := range c.lines {
			parentOK := l.parent < 0 || act[l.parent]
			switch l.key {
			case "host":
				act[i] = parentOK && matchList(l.args, host)
				continue
			case "match":
				ok, warn := r.match(l, host, remoteUser, v)
				if warn != "" {
					v.warnings = append(v.warnings, fmt.Sprintf("%s:%d: %s", l.file, l.line, warn))
				}
				act[i] = parentOK && ok
				continue
			}
			act[i] = parentOK && (l.section < 0 || act[l.section])
			if !act[i] || l.key == "include" {
				continue
			}
			if l.key == "identityfile" {
				if len(l.args) != 1 {
					return nil, lineErr(l, "IdentityFile takes one file")
				}
				v.identity = append(v.identity, l.args[0])
				continue
			}
			if _, seen := v.first[l.key]; !seen {
				if len(l.args) == 0 {
					return nil, lineErr(l, "%s needs a value", l.key)
				}
				v.first[l.key] = l.args
				v.where[l.key] = fmt.Sprintf("%s:%d", l.file, l.line)
				v.seq[l.key] = len(v.seq)
			}
		}
	}
	return v, nil
}

func lineErr(l configLine, format string, args ...any) error {
	p := parser{}
	return p.errorf(l.file, l.line, format, args...)
}

// match evaluates a Match line for host. The criteria ferry can evaluate
// are all, host, originalhost, user and localuser (each may be negated
// with !); a line with any other (exec, canonical, final, localnetwork,
// tagged …) does not match, and says so in a warning.
func (r *resolver) match(l configLine, host, remoteUser string, v *values) (bool, string) {
	args := l.args
	result := true
	for i := 0; i < len(args); i++ {
		crit := strings.ToLower(args[i])
		neg := false
		if c, ok := strings.CutPrefix(crit, "!"); ok {
			neg, crit = true, c
		}
		if crit == "all" {
			continue
		}
		if i+1 >= len(args) {
			return false, fmt.Sprintf("Match %s without an argument; section ignored", crit)
		}
		arg := strings.Split(args[i+1], ",")
		i++
		var subject string
		switch crit {
		case "host":
			subject = host
			if hn, ok := v.first["hostname"]; ok {
				subject = strings.ReplaceAll(hn[0], "%h", host)
			}
		case "originalhost":
			subject = host
		case "user":
			subject = remoteUser
			if u, ok := v.first["user"]; ok && subject == "" {
				subject = u[0]
			}
			if subject == "" {
				subject = r.localUser
			}
		case "localuser":
			subject = r.localUser
		default:
			return false, fmt.Sprintf("Match %s is not supported by ferry; section ignored", crit)
		}
		if matchList(arg, subject) == neg {
			result = false
		}
	}
	return result, ""
}

func (r *resolver) resolve(t Target, depth int, ownJumps bool) (*Endpoint, error) {
	if depth > maxJumpDepth {
		return nil, errkind.Errorf(errkind.BadInput, "%s: ProxyJump chain deeper than %d hosts (a loop in ssh_config?)", t.Host, maxJumpDepth)
	}
	v, err := r.collect(t.Host, t.User)
	if err != nil {
		return nil, err
	}
	e := &Endpoint{Name: t.Host, Warnings: v.warnings}
	get := func(k string) (string, bool) {
		a, ok := v.first[k]
		if !ok {
			return "", false
		}
		return a[0], true
	}
	bad := func(k, format string, args ...any) error {
		return errkind.Errorf(errkind.BadInput, "%s: %s: "+format, append([]any{v.where[k], k}, args...)...)
	}
	yes := func(k string) (bool, error) {
		s, ok := get(k)
		if !ok {
			return false, nil
		}
		switch strings.ToLower(s) {
		case "yes", "true":
			return true, nil
		case "no", "false":
			return false, nil
		}
		return false, bad(k, "want yes or no, not %q", s)
	}

	e.HostName = t.Host
	if hn, ok := get("hostname"); ok {
		hn, err := expandTokens(hn, map[byte]string{'h': t.Host})
		if err != nil {
			return nil, bad("hostname", "%v", err)
		}
		e.HostName = strings.TrimSuffix(strings.TrimPrefix(hn, "["), "]")
		if e.HostName == "" || strings.ContainsFunc(e.HostName, unsafeRune) {
			return nil, bad("hostname", "%q is not a host name", hn)
		}
	}
	e.Port = 22
	if p, ok := get("port"); ok {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return nil, bad("port", "%q is not a port", p)
		}
		e.Port = n
	}
	if t.Port != 0 {
		e.Port = t.Port
	}
	e.User = r.localUser
	if u, ok := get("user"); ok {
		if u == "" || strings.ContainsFunc(u, unsafeRune) {
			return nil, bad("user", "%q is not a user name", u)
		}
		e.User = u
	}
	if t.User != "" {
		e.User = t.User
	}
	tokens := map[byte]string{
		'd': r.home, 'u': r.localUser, 'h': e.HostName, 'n': t.Host,
		'p': strconv.Itoa(e.Port), 'r': e.User, 'i': strconv.Itoa(os.Getuid()),
	}
	if hn, err := os.Hostname(); err == nil {
		tokens['L'], _, _ = strings.Cut(hn, ".")
		tokens['l'] = hn
	}
	path := func(k, p string) (string, error) {
		p, err := expandTokens(expandTilde(p, r.home), tokens)
		if err != nil {
			return "", bad(k, "%v", err)
		}
		return expandTilde(p, r.home), nil
	}

	for _, f := range r.o.IdentityFiles {
		e.IdentityFiles = append(e.IdentityFiles, expandTilde(f, r.home))
	}
	for _, f := range v.identity {
		p, err := path("identityfile", f)
		if err != nil {
			return nil, err
		}
		if strings.EqualFold(p, "none") {
			continue
		}
		e.IdentityFiles = append(e.IdentityFiles, p)
	}
	if e.IdentitiesOnly, err = yes("identitiesonly"); err != nil {
		return nil, err
	}
	e.IdentityAgent = os.Getenv("SSH_AUTH_SOCK")
	if a, ok := get("identityagent"); ok {
		switch {
		case strings.EqualFold(a, "none"):
			e.IdentityAgent = ""
		case a == "SSH_AUTH_SOCK":
		case strings.HasPrefix(a, "$"):
			e.IdentityAgent = os.Getenv(strings.Trim(a[1:], "{}"))
		default:
			if e.IdentityAgent, err = path("identityagent", a); err != nil {
				return nil, err
			}
		}
	}

	if r.o.KnownHostsPath != "" {
		e.KnownHostsFiles = []string{expandTilde(r.o.KnownHostsPath, r.home)}
	} else {
		userFiles := []string{"~/.ssh/known_hosts", "~/.ssh/known_hosts2"}
		if a, ok := v.first["userknownhostsfile"]; ok {
			userFiles = a
		}
		globalFiles := []string{"/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2"}
		if a, ok := v.first["globalknownhostsfile"]; ok {
			globalFiles = a
		}
		for _, f := range append(append([]string{}, userFiles...), globalFiles...) {
			if strings.EqualFold(f, "none") {
				continue
			}
			p, err := path("userknownhostsfile", f)
			if err != nil {
				return nil, err
			}
			e.KnownHostsFiles = append(e.KnownHostsFiles, p)
		}
	}
	e.HostKeyAlias, _ = get("hostkeyalias")
	e.StrictHostKeyChecking, _ = get("stricthostkeychecking")
	if e.HashKnownHosts, err = yes("hashknownhosts"); err != nil {
		return nil, err
	}
	if e.BatchMode, err = yes("batchmode"); err != nil {
		return nil, err
	}
	seconds := func(k string) (time.Duration, error) {
		s, ok := get(k)
		if !ok || strings.EqualFold(s, "none") {
			return 0, nil
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > 1<<20 {
			return 0, bad(k, "%q is not a number of seconds", s)
		}
		return time.Duration(n) * time.Second, nil
	}
	if e.ConnectTimeout, err = seconds("connecttimeout"); err != nil {
		return nil, err
	}
	if e.ServerAliveInterval, err = seconds("serveraliveinterval"); err != nil {
		return nil, err
	}
	if s, ok := get("serveralivecountmax"); ok {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > 1000 {
			return nil, bad("serveralivecountmax", "%q is not a count", s)
		}
		e.ServerAliveCountMax = n
	}

	// ProxyJump and ProxyCommand exclude each other: the first one set
	// wins, as in OpenSSH.
	pj, hasPJ := get("proxyjump")
	pc, hasPC := get("proxycommand")
	if hasPJ && hasPC && v.seq["proxycommand"] < v.seq["proxyjump"] {
		hasPJ = false
	}
	if !hasPJ && hasPC && !strings.EqualFold(pc, "none") {
		return nil, errkind.Mark(errkind.NotBuilt, fmt.Errorf("%s: ProxyCommand for %s: %w: ferry connects itself; use ProxyJump, or -F a config without the ProxyCommand", v.where["proxycommand"], t.Host, errkind.ErrNotBuilt))
	}
	if hasPJ && ownJumps && !strings.EqualFold(pj, "none") {
		hops := strings.Split(pj, ",")
		if len(hops) > maxJumps {
			return nil, bad("proxyjump", "more than %d hosts", maxJumps)
		}
		for i, h := range hops {
			ht, err := parseJump(h)
			if err != nil {
				return nil, bad("proxyjump", "%v", err)
			}
			// The first hop is reached as its own config says (its own
			// ProxyJump included); each later one through the one before.
			je, err := r.resolve(ht, depth+1, i == 0)
			if err != nil {
				return nil, fmt.Errorf("ProxyJump %s for %s: %w", h, t.Host, err)
			}
			e.Jumps = append(e.Jumps, je)
		}
	}
	return e, nil
}

// unsafeRune is a character no host or user name holds: blanks and
// control characters.
func unsafeRune(r rune) bool { return r <= ' ' || r == 0x7f }

// parseJump reads one ProxyJump hop: [user@]host[:port] or
// ssh://[user@]host[:port].
func parseJump(s string) (Target, error) {
	s = strings.TrimPrefix(strings.TrimSpace(s), "ssh://")
	return ParseHost(s)
}

// expandTokens expands %-tokens from tokens and %%; an unknown token is an
// error, as in ssh.
func expandTokens(s string, tokens map[byte]string) (string, error) {
	if !strings.Contains(s, "%") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 >= len(s) {
			return "", fmt.Errorf("%q ends in a lone %%", s)
		}
		i++
		if s[i] == '%' {
			b.WriteByte('%')
			continue
		}
		v, ok := tokens[s[i]]
		if !ok {
			return "", fmt.Errorf("%q: token %%%c is not supported here", s, s[i])
		}
		b.WriteString(v)
	}
	return b.String(), nil
}
