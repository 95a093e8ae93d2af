package sshconn

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/term"

	"github.com/ferry-llm/ferry/internal/errkind"
)

// ErrAuth is wrapped by every authentication failure (*AuthError).
var ErrAuth = errors.New("authentication failed")

// ErrPassphrase is wrapped when an identity file needs a passphrase that
// cannot be asked for (no terminal) or was wrong.
var ErrPassphrase = errors.New("passphrase needed")

// AuthError is a server that accepted none of the keys ferry offered. It
// is not retryable: the same keys will be refused again.
type AuthError struct {
	Endpoint string   // user@host:port (alias)
	Tried    []string // the keys offered, each "source TYPE SHA256:…"
	Skipped  []string // identity files not offered, with why
	Err      error    // the library's error
}

func (e *AuthError) Unwrap() []error { return []error{ErrAuth, e.Err} }

func (e *AuthError) Kind() errkind.Kind { return errkind.Failure }

func (e *AuthError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %v: the server accepted none of the keys offered", e.Endpoint, ErrAuth)
	if len(e.Tried) == 0 {
		b.WriteString(" (there were none: no agent keys, no identity file)")
	} else {
		fmt.Fprintf(&b, " (%s)", strings.Join(e.Tried, "; "))
	}
	for _, s := range e.Skipped {
		fmt.Fprintf(&b, "; %s", s)
	}
	if len(e.Tried) == 0 {
		b.WriteString(". Name a key with -i or IdentityFile, or load one into ssh-agent")
	} else {
		b.WriteString(". Add one of them to the server's authorized_keys, name another with -i, or load it into ssh-agent")
	}
	return b.String()
}

// PassphraseFunc asks for the passphrase of an identity file. prompt
// names the file.
type PassphraseFunc func(prompt string) ([]byte, error)

// TerminalPassphrase asks on the controlling terminal (/dev/tty), with
// echo off. With no terminal it returns an error wrapping ErrPassphrase
// that says what to do instead.
func TerminalPassphrase(prompt string) ([]byte, error) {
	tty, err := os.OpenFile(terminalPath, os.O_RDWR, 0)
	if err != nil || !term.IsTerminal(int(tty.Fd())) {
		if tty != nil {
			tty.Close()
		}
		return nil, fmt.Errorf("%w and there is no terminal to ask on", ErrPassphrase)
	}
	defer tty.Close()
	if _, err := io.WriteString(tty, prompt); err != nil {
		return nil, err
	}
	p, err := term.ReadPassword(int(tty.Fd()))
	io.WriteString(tty, "\n")
	return p, err
}

// terminalPath is the terminal TerminalPassphrase asks on; tests point it
// at a pseudo-terminal, or at a file that is not one.
var terminalPath = "/dev/tty"

// auth collects the keys to offer one endpoint: the agent's (only those
// matching an identity file with IdentitiesOnly), then the identity files
// in order. An encrypted file whose public key is known (from the file or
// its .pub) is offered by that key and decrypted only when the server
// accepts it, so a passphrase is asked for at most once and only when
// needed.
type auth struct {
	e        *Endpoint
	d        *Dialer
	prompt   PassphraseFunc
	signers  []ssh.Signer
	sources  []string // per signer: "agent" or the identity file
	tried    []string
	skipped  []string
	agentErr error
	signErr  error // the first identity file that failed to open when asked to sign
	closer   io.Closer
	// pause(true) lifts the handshake's deadline while a passphrase is
	// asked (or another connection of the Dialer asks it); pause(false)
	// sets it again.
	pause func(paused bool)
}

// defaultIdentities are tried when no IdentityFile is configured, as ssh
// does (the ones that exist).
var defaultIdentities = []string{"~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa"}

func newAuth(e *Endpoint, d *Dialer) (*auth, error) {
	o := d.o
	a := &auth{e: e, d: d, prompt: o.Passphrase}
	if a.prompt == nil {
		a.prompt = TerminalPassphrase
	}
	if e.BatchMode {
		a.prompt = func(string) ([]byte, error) {
			return nil, fmt.Errorf("%w and BatchMode forbids asking", ErrPassphrase)
		}
	}
	files := e.IdentityFiles
	explicit := make(map[string]bool, len(o.IdentityFiles))
	for _, f := range o.IdentityFiles {
		explicit[expandTilde(f, homeDir())] = true
	}
	if len(files) == 0 {
		for _, f := range defaultIdentities {
			files = append(files, expandTilde(f, homeDir()))
		}
	}

	var fileSigners []ssh.Signer
	var filePubs []ssh.PublicKey
	var filePaths []string
	for _, f := range files {
		s, pub, err := a.loadIdentity(f)
		switch {
		case err == nil:
			fileSigners = append(fileSigners, s)
			filePubs = append(filePubs, pub)
			filePaths = append(filePaths, f)
		case errors.Is(err, os.ErrNotExist) && !explicit[f]:
			// ssh skips configured identity files that do not exist.
		case explicit[f]:
			return nil, errkind.Mark(errkind.BadInput, fmt.Errorf("-i %s: %w", f, err))
		default:
			// A configured file ferry cannot use (a FIDO key, a public key
			// named by mistake) is skipped as ssh skips it, and named if
			// authentication then fails.
			a.skipped = append(a.skipped, fmt.Sprintf("identity file %s not used: %v", f, err))
		}
	}

	var agentSigners []ssh.Signer
	if e.IdentityAgent != "" {
		conn, err := net.Dial("unix", e.IdentityAgent)
		if err != nil {
			// ssh goes on without the agent; so do we, and the auth
			// failure, if one follows, says why the agent was not used.
			a.agentErr = err
		} else {
			a.closer = conn
			ss, err := agent.NewClient(conn).Signers()
			if err != nil {
				a.agentErr = err
			}
			agentSigners = ss
		}
	}
	for _, s := range agentSigners {
		if e.IdentitiesOnly && !containsKey(filePubs, s.PublicKey()) {
			continue
		}
		a.signers = append(a.signers, s)
		a.sources = append(a.sources, "agent")
	}
	for i, s := range fileSigners {
		// A key the agent holds is offered once, by the agent, which
		// needs no passphrase.
		if containsKey(signerKeys(a.signers), filePubs[i]) {
			continue
		}
		a.signers = append(a.signers, s)
		a.sources = append(a.sources, filePaths[i])
	}
	if a.agentErr != nil {
		a.skipped = append(a.skipped, fmt.Sprintf("agent %s not used: %v", e.IdentityAgent, a.agentErr))
	}
	return a, nil
}

func homeDir() string {
	h, _ := os.UserHomeDir()
	return h
}

func signerKeys(ss []ssh.Signer) []ssh.PublicKey {
	out := make([]ssh.PublicKey, len(ss))
	for i, s := range ss {
		out[i] = s.PublicKey()
	}
	return out
}

func containsKey(keys []ssh.PublicKey, k ssh.PublicKey) bool {
	m := string(k.Marshal())
	for _, x := range keys {
		if string(x.Marshal()) == m {
			return true
		}
	}
	return false
}

// maxKeyFile bounds an identity file read (an RSA-16384 key is ~13 KB).
const maxKeyFile = 1 << 20

func (a *auth) loadIdentity(path string) (ssh.Signer, ssh.PublicKey, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	pem, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	f.Close()
	if err != nil {
		return nil, nil, err
	}
	if len(pem) > maxKeyFile {
		return nil, nil, fmt.Errorf("larger than %d bytes: not a private key", maxKeyFile)
	}
	s, err := ssh.ParsePrivateKey(pem)
	if err == nil {
		return s, s.PublicKey(), nil
	}
	var pm *ssh.PassphraseMissingError
	if !errors.As(err, &pm) {
		return nil, nil, err
	}
	pub := pm.PublicKey
	if pub == nil {
		// Legacy PEM encryption hides the public key; ssh-keygen writes
		// it beside the key.
		if b, err := os.ReadFile(path + ".pub"); err == nil {
			if k, _, _, _, err := ssh.ParseAuthorizedKey(b); err == nil {
				pub = k
			}
		}
	}
	ls := &lockedSigner{path: path, pem: pem, pub: pub, a: a, k: a.d.unlocked(path)}
	if pub == nil {
		// Without the public key the file must be opened now to offer it.
		if err := ls.unlock(); err != nil {
			return nil, nil, err
		}
		return ls.k.signer, ls.k.signer.PublicKey(), nil
	}
	return ls, pub, nil
}

// lockedSigner is an encrypted identity file, decrypted on first use.
type lockedSigner struct {
	path string
	pem  []byte
	pub  ssh.PublicKey
	a    *auth
	k    *unlockedKey
}

// unlockedKey is an encrypted identity file's key once decrypted, shared
// by every connection of a Dialer, so its passphrase is asked once; or
// why it could not be (also asked once: a missing terminal or a wrong
// passphrase will not change between connections).
type unlockedKey struct {
	once   sync.Once
	signer ssh.Signer
	err    error // names the file, not the endpoint
}

func (l *lockedSigner) unlock() error {
	k := l.k
	if l.a.pause != nil {
		l.a.pause(true)
		defer l.a.pause(false)
	}
	k.once.Do(func() {
		prompt := fmt.Sprintf("Enter passphrase for key '%s': ", l.path)
		pass, err := l.a.prompt(prompt)
		if err != nil {
			k.err = errkind.Errorf(errkind.Failure, "identity file %s is passphrase-protected and the server accepts it, but %w; load it into ssh-agent (ssh-add %s) or run from a terminal", l.path, err, shellQuote(l.path))
			if !errors.Is(err, ErrPassphrase) {
				k.err = fmt.Errorf("identity file %s: reading its passphrase: %w", l.path, err)
			}
			return
		}
		s, err := ssh.ParsePrivateKeyWithPassphrase(l.pem, pass)
		clear(pass)
		if err != nil {
			k.err = fmt.Errorf("identity file %s: %w (wrong passphrase?): %v", l.path, ErrPassphrase, err)
			return
		}
		k.signer = s
	})
	if k.err != nil {
		err := fmt.Errorf("%s: %w", l.a.e, k.err)
		if l.a.signErr == nil {
			l.a.signErr = err
		}
		return err
	}
	return nil
}

func (l *lockedSigner) PublicKey() ssh.PublicKey { return l.pub }

func (l *lockedSigner) Sign(rand io.Reader, data []byte) (*ssh.Signature, error) {
	if err := l.unlock(); err != nil {
		return nil, err
	}
	return l.k.signer.Sign(rand, data)
}

func (l *lockedSigner) SignWithAlgorithm(rand io.Reader, data []byte, algorithm string) (*ssh.Signature, error) {
	if err := l.unlock(); err != nil {
		return nil, err
	}
	if as, ok := l.k.signer.(ssh.AlgorithmSigner); ok {
		return as.SignWithAlgorithm(rand, data, algorithm)
	}
	return l.k.signer.Sign(rand, data)
}

// Algorithms lists the signature algorithms of the key's type, so that
// x/crypto picks rsa-sha2-* for an RSA key it has not decrypted yet.
func (l *lockedSigner) Algorithms() []string { return algorithmsFor(l.pub.Type()) }

var _ ssh.MultiAlgorithmSigner = (*lockedSigner)(nil)

// methods are the auth methods for the handshake; the keys offered are
// recorded for the error message.
func (a *auth) methods() []ssh.AuthMethod {
	return []ssh.AuthMethod{ssh.PublicKeysCallback(func() ([]ssh.Signer, error) {
		a.tried = a.tried[:0]
		for i, s := range a.signers {
			a.tried = append(a.tried, a.sources[i]+" "+keyDesc(s.PublicKey()))
		}
		return a.signers, nil
	})}
}

func (a *auth) close() {
	if a.closer != nil {
		a.closer.Close()
	}
}
