package sshconn

import (
	"net"
	"strconv"
	"strings"

	"github.com/ferry-llm/ferry/internal/errkind"
)

// Target is a remote place as the command line names it:
// [user@]host[:port]:DIR. Host is an ssh_config alias or an address
// (an IPv6 address without its brackets); User and Port are zero when the
// argument does not give them, so that ssh_config can.
type Target struct {
	User string
	Host string
	Port int    // 0: not given
	Dir  string // the remote path after the colon; "" is the remote home directory
}

// String gives the target back in the form ParseTarget reads.
func (t Target) String() string {
	return t.HostString() + ":" + t.Dir
}

// HostString is [user@]host[:port], with an IPv6 host in brackets.
func (t Target) HostString() string {
	var b strings.Builder
	if t.User != "" {
		b.WriteString(t.User + "@")
	}
	if strings.Contains(t.Host, ":") {
		b.WriteString("[" + t.Host + "]")
	} else {
		b.WriteString(t.Host)
	}
	if t.Port != 0 {
		b.WriteString(":" + strconv.Itoa(t.Port))
	}
	return b.String()
}

// LooksRemote reports whether a command-line argument names a remote
// place the way scp tells them apart: a colon before any slash (so
// ./a:b and /x/y:z are local paths), or a bracketed IPv6 host.
func LooksRemote(arg string) bool {
	if strings.HasPrefix(arg, "[") {
		return true
	}
	c := strings.IndexByte(arg, ':')
	if c <= 0 {
		return false
	}
	s := strings.IndexByte(arg, '/')
	return s < 0 || c < s
}

// ParseTarget reads [user@]host[:port]:DIR, as scp takes host:DIR plus an
// optional port between host and path: "mac2:/models", "me@mac2:22:/m",
// "[fe80::1%en0]:/m". A port is taken only when digits stand between two
// colons, so "host:123" is DIR "123" on host. Errors are usage errors.
func ParseTarget(s string) (Target, error) {
	hostPart, dir, ok := splitHostDir(s)
	if !ok {
		return Target{}, errkind.Errorf(errkind.Usage, "%q is not a remote target: want [user@]host[:port]:DIR", s)
	}
	t, err := parseHost(hostPart, s)
	if err != nil {
		return Target{}, err
	}
	// "host:PORT:DIR": digits, then another colon.
	if t.Port == 0 {
		if i := strings.IndexByte(dir, ':'); i > 0 && allDigits(dir[:i]) {
			p, err := parsePort(dir[:i], s)
			if err != nil {
				return Target{}, err
			}
			t.Port, dir = p, dir[i+1:]
		}
	}
	t.Dir = dir
	return t, nil
}

// ParseHost reads [user@]host[:port] (no directory), the way netcheck and
// ProxyJump name a host. A bare IPv6 address is taken whole, without a
// port; give a port with brackets: [::1]:2222.
func ParseHost(s string) (Target, error) {
	if strings.Count(s, ":") > 1 && !strings.Contains(s, "[") {
		user, host := splitUser(s)
		if net.ParseIP(stripZone(host)) == nil {
			return Target{}, errkind.Errorf(errkind.Usage, "%q: not a host: want [user@]host[:port] (IPv6 in brackets)", s)
		}
		return checkTarget(Target{User: user, Host: host}, s)
	}
	user, rest := splitUser(s)
	host, portStr := rest, ""
	if strings.HasPrefix(rest, "[") {
		end := strings.IndexByte(rest, ']')
		if end < 0 {
			return Target{}, errkind.Errorf(errkind.Usage, "%q: unclosed [ in host", s)
		}
		host, portStr = rest[1:end], rest[end+1:]
		if portStr != "" && !strings.HasPrefix(portStr, ":") {
			return Target{}, errkind.Errorf(errkind.Usage, "%q: want :PORT after ]", s)
		}
		portStr = strings.TrimPrefix(portStr, ":")
	} else if i := strings.IndexByte(rest, ':'); i >= 0 {
		host, portStr = rest[:i], rest[i+1:]
	}
	t := Target{User: user, Host: host}
	if portStr != "" || strings.HasSuffix(rest, ":") {
		p, err := parsePort(portStr, s)
		if err != nil {
			return Target{}, err
		}
		t.Port = p
	}
	return checkTarget(t, s)
}

// splitHostDir splits at the colon that ends the host part (after a
// bracketed host's closing bracket).
func splitHostDir(s string) (host, dir string, ok bool) {
	at := strings.LastIndexByte(s[:max(0, strings.IndexByte(s, ':'))], '@')
	if at+1 < len(s) && s[at+1] == '[' {
		end := strings.IndexByte(s[at+1:], ']')
		if end < 0 {
			return "", "", false
		}
		end += at + 1
		if end+1 >= len(s) || s[end+1] != ':' {
			return "", "", false
		}
		return s[:end+1], s[end+2:], true
	}
	i := strings.IndexByte(s, ':')
	if i < 0 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}

func parseHost(hostPart, whole string) (Target, error) {
	user, host := splitUser(hostPart)
	if strings.HasPrefix(host, "[") {
		if !strings.HasSuffix(host, "]") {
			return Target{}, errkind.Errorf(errkind.Usage, "%q: unclosed [ in host", whole)
		}
		host = host[1 : len(host)-1]
		if net.ParseIP(stripZone(host)) == nil {
			return Target{}, errkind.Errorf(errkind.Usage, "%q: [%s] is not an IP address", whole, host)
		}
	}
	return checkTarget(Target{User: user, Host: host}, whole)
}

// splitUser splits user@rest; an empty user before @ is kept as "@" so
// that checkTarget refuses it.
func splitUser(s string) (user, rest string) {
	if i := strings.LastIndexByte(s, '@'); i >= 0 {
		if i == 0 {
			return "@", s[1:]
		}
		return s[:i], s[i+1:]
	}
	return "", s
}

func checkTarget(t Target, whole string) (Target, error) {
	switch {
	case t.Host == "":
		return Target{}, errkind.Errorf(errkind.Usage, "%q: no host", whole)
	case strings.HasPrefix(t.Host, "-"):
		return Target{}, errkind.Errorf(errkind.Usage, "%q: a host cannot start with -", whole)
	case strings.ContainsAny(t.Host, " \t\r\n/@[]'\"\\"):
		return Target{}, errkind.Errorf(errkind.Usage, "%q: %q is not a host name", whole, t.Host)
	case t.User == "@":
		return Target{}, errkind.Errorf(errkind.Usage, "%q: empty user before @", whole)
	case strings.ContainsAny(t.User, " \t\r\n/:[]'\"\\"):
		return Target{}, errkind.Errorf(errkind.Usage, "%q: %q is not a user name", whole, t.User)
	}
	return t, nil
}

func parsePort(s, whole string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil || !allDigits(s) || p < 1 || p > 65535 {
		return 0, errkind.Errorf(errkind.Usage, "%q: port %q is not a number from 1 to 65535", whole, s)
	}
	return p, nil
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// stripZone removes an IPv6 zone (%en0) for net.ParseIP.
func stripZone(h string) string {
	if i := strings.IndexByte(h, '%'); i >= 0 {
		return h[:i]
	}
	return h
}

// hostPort joins host and port for dialing and for known_hosts.
func hostPort(host string, port int) string {
	return net.JoinHostPort(host, strconv.Itoa(port))
}
