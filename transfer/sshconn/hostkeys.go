package sshconn

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/ferry-llm/ferry/internal/errkind"
)

// Host-key errors, for errors.Is; the error itself is a *HostKeyError.
var (
	ErrHostKeyUnknown = errkind.New(errkind.VerifyFailed, "host key not known")
	ErrHostKeyChanged = errkind.New(errkind.VerifyFailed, "HOST KEY CHANGED")
	ErrHostKeyRevoked = errkind.New(errkind.VerifyFailed, "host key revoked")
)

// HostKeyError is a server whose host key ferry would not trust. Its kind
// is VerifyFailed (exit 3) and it is never retried: only the user can
// decide to trust a key.
type HostKeyError struct {
	Host        string        // the host as known_hosts names it: host or [host]:port
	Key         ssh.PublicKey // the key the server presented
	Files       []string      // the known_hosts files read
	Known       []knownhosts.KnownKey
	Err         error // ErrHostKeyUnknown, ErrHostKeyChanged or ErrHostKeyRevoked
	hostName    string
	port        int
	acceptFile  string
	writeFailed error
	certErr     error  // why a host certificate was not trusted
	strict      string // the config's StrictHostKeyChecking, for the hint
}

func (e *HostKeyError) Unwrap() error { return e.Err }

func (e *HostKeyError) Kind() errkind.Kind { return errkind.VerifyFailed }

func (e *HostKeyError) Error() string {
	fp := keyDesc(e.Key)
	switch {
	case errors.Is(e.Err, ErrHostKeyRevoked):
		k := e.Known[0]
		return fmt.Sprintf("%s: host key %s is marked @revoked in %s:%d: refusing to connect", e.Host, fp, k.Filename, k.Line)
	case errors.Is(e.Err, ErrHostKeyChanged):
		var b strings.Builder
		fmt.Fprintf(&b, "%s: %v: the server presented %s, but known_hosts holds another key for it", e.Host, e.Err, fp)
		for _, k := range e.Known {
			fmt.Fprintf(&b, "; %s:%d has %s", k.Filename, k.Line, keyDesc(k.Key))
		}
		fmt.Fprintf(&b, ". Someone may be intercepting the connection, or the host was reinstalled. If you know the new key is right, remove the old one (ssh-keygen -R %s", shellQuote(e.Host))
		if len(e.Known) > 0 {
			fmt.Fprintf(&b, " -f %s", shellQuote(e.Known[0].Filename))
		}
		b.WriteString(") and connect again; ferry never replaces a changed key itself")
		return b.String()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %v: the server presented %s, which is not in ", e.Host, e.Err, fp)
	if len(e.Files) == 0 {
		b.WriteString("any known_hosts file (none exists)")
	} else {
		b.WriteString(strings.Join(e.Files, ", "))
	}
	if e.certErr != nil {
		fmt.Fprintf(&b, " (it came in a host certificate that no @cert-authority line vouches for: %v)", e.certErr)
	}
	if e.writeFailed != nil {
		fmt.Fprintf(&b, "; --accept-new could not record it: %v", e.writeFailed)
		return b.String()
	}
	scan := "ssh-keyscan"
	if e.port != 22 {
		scan += " -p " + strconv.Itoa(e.port)
	}
	scan += " -t " + keyscanType(e.Key.Type()) + " " + e.hostName
	fmt.Fprintf(&b, ". Check the fingerprint on the server (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), then trust it with: %s >> %s   (or rerun with --accept-new)", scan, shellQuote(e.acceptFile))
	switch strings.ToLower(e.strict) {
	case "no", "off", "accept-new":
		fmt.Fprintf(&b, "; ssh_config's StrictHostKeyChecking %s is not followed: ferry trusts a new key only when told to", e.strict)
	}
	return b.String()
}

// keyscanType is ssh-keyscan's -t name for a key type.
func keyscanType(t string) string {
	switch {
	case t == ssh.KeyAlgoED25519:
		return "ed25519"
	case t == ssh.KeyAlgoRSA:
		return "rsa"
	case strings.HasPrefix(t, "ecdsa-sha2-"):
		return "ecdsa"
	}
	return t
}

// keyDesc is "ED25519 SHA256:…", as ssh prints a key.
func keyDesc(k ssh.PublicKey) string {
	if k == nil {
		return "no key"
	}
	t := strings.ToUpper(strings.TrimPrefix(k.Type(), "ssh-"))
	if strings.HasPrefix(k.Type(), "ecdsa-") {
		t = "ECDSA"
	}
	return t + " " + ssh.FingerprintSHA256(k)
}

func shellQuote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\n'\"$`\\*?[]{}()<>|&;#~!") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// hostKeys checks one endpoint's host key against its known_hosts files.
type hostKeys struct {
	e         *Endpoint
	files     []string // the files that exist
	cb        ssh.HostKeyCallback
	acceptNew bool
	// err is the last refusal, so Dial returns it rather than the
	// handshake's wrapping of it.
	err error
	// lines caches known_hosts files read to tell @cert-authority lines.
	lines map[string][]string
}

func newHostKeys(e *Endpoint, acceptNew bool) (*hostKeys, error) {
	h := &hostKeys{e: e, acceptNew: acceptNew}
	for _, f := range e.KnownHostsFiles {
		fi, err := os.Stat(f)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("known_hosts: %w", err)
		}
		if fi.IsDir() {
			return nil, errkind.Errorf(errkind.BadInput, "known_hosts %s is a directory", f)
		}
		h.files = append(h.files, f)
	}
	if len(h.files) > 0 {
		cb, err := knownhosts.New(h.files...)
		if err != nil {
			return nil, errkind.Mark(errkind.BadInput, fmt.Errorf("known_hosts: %w", err))
		}
		h.cb = cb
	}
	return h, nil
}

// acceptFile is where --accept-new records a key: the first user file.
func (h *hostKeys) acceptFile() string {
	if len(h.e.KnownHostsFiles) > 0 {
		return h.e.KnownHostsFiles[0]
	}
	return "~/.ssh/known_hosts"
}

// known returns the host keys and the @cert-authority keys known_hosts
// holds for the endpoint.
func (h *hostKeys) known() (keys, cas []knownhosts.KnownKey) {
	if h.cb == nil {
		return nil, nil
	}
	// Ask with a key no file can hold: the refusal lists every line that
	// matches the host, @cert-authority lines among them.
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	probe, _ := ssh.NewPublicKey(priv.Public())
	var ke *knownhosts.KeyError
	if errors.As(h.cb(h.e.lookupAddr(), probeAddr, probe), &ke) {
		return h.split(ke.Want)
	}
	return nil, nil
}

// split separates @cert-authority lines from host-key lines: the
// library's KeyError.Want lists both alike (a CA key for the host makes
// every plain key look like a changed one), so the line itself is read.
func (h *hostKeys) split(want []knownhosts.KnownKey) (keys, cas []knownhosts.KnownKey) {
	for _, k := range want {
		if h.isCALine(k) {
			cas = append(cas, k)
		} else {
			keys = append(keys, k)
		}
	}
	return keys, cas
}

// maxKnownHostsSize bounds a known_hosts file read for marker lookups.
const maxKnownHostsSize = 64 << 20

func (h *hostKeys) isCALine(k knownhosts.KnownKey) bool {
	if h.lines == nil {
		h.lines = map[string][]string{}
	}
	lines, ok := h.lines[k.Filename]
	if !ok {
		if f, err := os.Open(k.Filename); err == nil {
			b, _ := io.ReadAll(io.LimitReader(f, maxKnownHostsSize))
			f.Close()
			lines = strings.Split(string(b), "\n")
		}
		h.lines[k.Filename] = lines
	}
	if k.Line < 1 || k.Line > len(lines) {
		return false
	}
	return strings.HasPrefix(strings.TrimLeft(lines[k.Line-1], " \t"), "@cert-authority")
}

// probeAddr is the remote address given to the known_hosts callback: it
// looks the host up by name (knownHostsName), never by this address, as
// OpenSSH does without CheckHostIP.
var probeAddr = &net.TCPAddr{IP: net.IPv4zero}

// algorithms is the host-key algorithm preference for the handshake:
// certificates first when a CA is known for the host, then the types of
// the keys known for it (so that a host with an ed25519 and an ECDSA key
// is not refused for showing the one we lack), then the rest.
func (h *hostKeys) algorithms() []string {
	keys, cas := h.known()
	var first []string
	add := func(as ...string) {
		for _, a := range as {
			if !slices.Contains(first, a) {
				first = append(first, a)
			}
		}
	}
	if len(cas) > 0 {
		for _, a := range ssh.SupportedAlgorithms().HostKeys {
			if strings.Contains(a, "-cert-") {
				add(a)
			}
		}
	}
	for _, k := range keys {
		add(algorithmsFor(k.Key.Type())...)
	}
	if len(first) == 0 {
		return nil // the library's default order
	}
	add(ssh.SupportedAlgorithms().HostKeys...)
	return first
}

// algorithmsFor maps a key type to the signature algorithms that use it.
func algorithmsFor(keyType string) []string {
	if keyType == ssh.KeyAlgoRSA {
		return []string{ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA}
	}
	return []string{keyType}
}

// check is the ssh.HostKeyCallback.
func (h *hostKeys) check(_ string, _ net.Addr, key ssh.PublicKey) error {
	name := h.e.knownHostsName()
	herr := &HostKeyError{Host: name, Key: key, Files: h.files, hostName: h.e.HostName, port: h.e.Port,
		acceptFile: h.acceptFile(), strict: h.e.StrictHostKeyChecking}
	if h.e.HostKeyAlias != "" {
		herr.hostName = h.e.HostKeyAlias
	}
	var err error
	if h.cb != nil {
		err = h.cb(h.e.lookupAddr(), probeAddr, key)
		if err == nil {
			return nil
		}
	}
	var ke *knownhosts.KeyError
	var re *knownhosts.RevokedError
	if cert, ok := key.(*ssh.Certificate); ok && !errors.As(err, &re) {
		// A host certificate no @cert-authority line vouches for (or
		// that is invalid): OpenSSH falls back to the plain key inside
		// it, and so do we.
		herr.certErr = err
		if herr.certErr == nil {
			herr.certErr = errors.New("no known_hosts file, so no @cert-authority")
		}
		key = cert.Key
		herr.Key = key
		err = nil
		if h.cb != nil {
			if err = h.cb(h.e.lookupAddr(), probeAddr, key); err == nil {
				return nil
			}
		}
	}
	var knownKeys []knownhosts.KnownKey
	if errors.As(err, &ke) {
		knownKeys, _ = h.split(ke.Want)
	}
	switch {
	case h.cb == nil || ke != nil && len(knownKeys) == 0:
		herr.Err = ErrHostKeyUnknown
		if h.acceptNew {
			if werr := h.appendKnownHost(h.acceptFile(), name, h.e.lookupAddr(), key, h.e.HashKnownHosts); werr != nil {
				herr.writeFailed = werr
			} else {
				return nil
			}
		}
	case ke != nil:
		herr.Err, herr.Known = ErrHostKeyChanged, knownKeys
	case errors.As(err, &re):
		herr.Err, herr.Known = ErrHostKeyRevoked, []knownhosts.KnownKey{re.Revoked}
	default:
		return fmt.Errorf("%s: checking the host key: %w", name, err)
	}
	h.err = herr
	return herr
}

// appendKnownHost adds one line for host to file, like ssh's
// StrictHostKeyChecking=accept-new: under an exclusive lock (ssh does not
// lock; two ferry runs accepting at once must not interleave), after
// checking again that no line for the host appeared meanwhile, in one
// write, then fsync.
func (h *hostKeys) appendKnownHost(file, host, lookup string, key ssh.PublicKey, hashed bool) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(file, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := lockFile(f); err != nil {
		return fmt.Errorf("%s: lock: %w", file, err)
	}
	defer unlockFile(f)
	// Another process may have accepted the key while we waited.
	if cb, err := knownhosts.New(file); err == nil {
		switch err := cb(lookup, probeAddr, key); {
		case err == nil:
			return nil
		default:
			var ke *knownhosts.KeyError
			if errors.As(err, &ke) {
				delete(h.lines, file) // it may have grown since it was read
				if keys, _ := h.split(ke.Want); len(keys) > 0 {
					return fmt.Errorf("%s: another key for %s was added meanwhile (%s:%d)", file, host, keys[0].Filename, keys[0].Line)
				}
			}
		}
	}
	// A file not ending in a newline gets one first.
	st, err := f.Stat()
	if err != nil {
		return err
	}
	var line bytes.Buffer
	if st.Size() > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, st.Size()-1); err != nil {
			return err
		}
		if last[0] != '\n' {
			line.WriteByte('\n')
		}
	}
	name := host
	if hashed {
		name = knownhosts.HashHostname(host)
	}
	line.WriteString(knownhosts.Line([]string{name}, key) + "\n")
	if _, err := f.Write(line.Bytes()); err != nil {
		return err
	}
	return f.Sync()
}
