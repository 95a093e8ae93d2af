package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"github.com/ferry-llm/ferry/internal/errkind"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"golang.org/x/crypto/ssh"

	"github.com/ferry-llm/ferry/internal/jsonout"
	"github.com/ferry-llm/ferry/internal/progress"
	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/netcheck"
	"github.com/ferry-llm/ferry/transfer"
	"github.com/ferry-llm/ferry/transfer/sshconn"
)

// transferStage sends the outputs of its from stages to every host of to,
// as `ferry transfer` does (transfer.Run: parallel streams, sha256 checked
// on each host, resumable):
//
//	transfer: { from: [quants, mlx4], to: [studio-a:~/models/x, studio-b:~/models/x], streams: 4, sessions: 4 }
//
// Stage S's output P lands at DIR/S/P on every host. Each file's digest
// comes from the manifest (nothing is hashed twice); hosts are reached as
// the user's ssh reaches them (~/.ssh/config, agent, known_hosts). The
// stage's output is transfer-record.json: per destination, every file
// with its digest, verified there, and the remote tool that verified it,
// and what netcheck found on the way there (route, interface, path MTU,
// findings; no timings: the record is the same for the same result).
// Before a byte goes to a destination, netcheck checks it with via,
// expect_mtu and require_wired as its requirements (a failure fails that
// destination with the remedy; skip_netcheck: true skips the checks), and
// via binds every SSH connection to that interface. A failed
// destination fails the stage (no record); the journals in the stage's
// work directory make the next run send only what is missing. A finished
// transfer is not run again unless its inputs or destinations change;
// `ferry pipeline run --verify` runs it again, which re-hashes every
// remote file and sends only what does not match.
type transferStage struct {
	From []string `json:"from"`
	To   []string `json:"to"`
	// DeleteExtra (delete_extra: true) removes what a destination holds
	// under the stage directories that the inputs do not (a quant dropped
	// from the list), as rsync --delete does; without it such files are
	// listed in the record. It changes what the destinations hold: part of
	// the key.
	DeleteExtra bool `json:"delete_extra,omitempty"`
	Streams     int  `json:"-"` // how, not what: not part of the key
	Sessions    int  `json:"-"`
	TransferNetcheck
	// SkipNetcheck (skip_netcheck: true) sends without the route and
	// interface checks; how, not what: not part of the key.
	SkipNetcheck bool `json:"-"`
	// SSH is how hosts are reached (ssh_config, known_hosts, identity),
	// as ferry transfer's --ssh-config, --known-hosts and -i; the same
	// flags of ferry pipeline run take precedence. Not part of the key.
	SSH SSHSettings `json:"-"`

	dests []stageDest // in the order of To
}

// stageDest is one destination of the stage: an SSH target, a local
// directory (absolute) or an S3 prefix.
type stageDest struct {
	ssh   *sshconn.Target
	local string
	s3    string // s3://BUCKET/PREFIX
}

// SSHSettings are the SSH client settings a transfer stage reaches its
// hosts with: ssh_config ("none": no config), known_hosts and identity
// files; empty: as ssh reads the user's.
type SSHSettings struct {
	Config     string
	KnownHosts string
	Identity   []string
}

// over is s with what o sets taking precedence.
func (s SSHSettings) over(o SSHSettings) SSHSettings {
	if o.Config != "" {
		s.Config = o.Config
	}
	if o.KnownHosts != "" {
		s.KnownHosts = o.KnownHosts
	}
	if len(o.Identity) > 0 {
		s.Identity = o.Identity
	}
	return s
}

var _ Stage = (*transferStage)(nil)
var _ Planner = (*transferStage)(nil)
var _ remoteResults = (*transferStage)(nil)

// TransferNetcheck are the transfer stage's route and interface
// requirements, checked by netcheck before a byte goes to each
// destination: the egress interface to bind to, the MTU the path must
// carry, no Wi-Fi.
type TransferNetcheck struct {
	Via          string `json:"via,omitempty"`
	ExpectMTU    int64  `json:"expect_mtu,omitempty"`
	RequireWired bool   `json:"require_wired,omitempty"`
}

func newTransfer(p *Params) (Stage, error) {
	s := &transferStage{}
	var err error
	if s.From, err = p.Refs("from", true); err != nil {
		return nil, err
	}
	if s.To, err = p.Strings("to", true); err != nil {
		return nil, err
	}
	if len(s.To) == 0 {
		return nil, p.Errorf("to", "needs at least one destination: [user@]HOST:DIR or a local directory")
	}
	seen := map[string]bool{}
	for _, to := range s.To {
		if transfer.IsS3(to) {
			u := strings.TrimRight(to, "/")
			if seen[u] {
				return nil, p.Errorf("to", "%s given twice", to)
			}
			seen[u] = true
			s.dests = append(s.dests, stageDest{s3: u})
			continue
		}
		if scheme, _, ok := strings.Cut(to, "://"); ok && scheme != "file" && !strings.Contains(scheme, "/") {
			// Not HOST:DIR with a host named like a scheme.
			return nil, errkind.Mark(errkind.NotBuilt, fmt.Errorf("%v: a transfer stage to a %s:// destination is %w (s3://BUCKET/PREFIX, HOST:DIR and local directories are)",
				p.Errorf("to", "%s", to), scheme, errkind.ErrNotBuilt))
		}
		if dir, ok := transfer.LocalDir(to); ok {
			abs, err := ResolvePath(p.Dir(), dir)
			if err != nil {
				return nil, p.Errorf("to", "%v", err)
			}
			if seen[abs] {
				return nil, p.Errorf("to", "%s given twice", to)
			}
			seen[abs] = true
			s.dests = append(s.dests, stageDest{local: abs})
			continue
		}
		t, err := sshconn.ParseTarget(to)
		if err != nil {
			return nil, p.Errorf("to", "%v", err)
		}
		if seen[t.String()] {
			return nil, p.Errorf("to", "%s given twice", to)
		}
		seen[t.String()] = true
		s.dests = append(s.dests, stageDest{ssh: &t})
	}
	n, err := p.Int("streams", 4)
	if err != nil {
		return nil, err
	}
	if n < 1 || n > transfer.MaxStreams {
		return nil, p.Errorf("streams", "must be between 1 and %d", transfer.MaxStreams)
	}
	s.Streams = int(n)
	if n, err = p.Int("sessions", transfer.SessionsPerConn); err != nil {
		return nil, err
	}
	if n < 1 || n > transfer.MaxSessions {
		return nil, p.Errorf("sessions", "must be between 1 and %d", transfer.MaxSessions)
	}
	s.Sessions = int(n)
	if s.Via, err = p.String("via", false); err != nil {
		return nil, err
	}
	if s.ExpectMTU, err = p.Int("expect_mtu", 0); err != nil {
		return nil, err
	}
	if s.ExpectMTU < 0 || s.ExpectMTU > 1<<16 {
		return nil, p.Errorf("expect_mtu", "must be between 68 and 65536")
	}
	if s.RequireWired, err = p.Bool("require_wired", false); err != nil {
		return nil, err
	}
	if s.SkipNetcheck, err = p.Bool("skip_netcheck", false); err != nil {
		return nil, err
	}
	if s.DeleteExtra, err = p.Bool("delete_extra", false); err != nil {
		return nil, err
	}
	if s.SSH.Config, err = p.String("ssh_config", false); err != nil {
		return nil, err
	}
	if s.SSH.Config != "" && s.SSH.Config != "none" {
		if s.SSH.Config, err = p.Path("ssh_config", false); err != nil {
			return nil, err
		}
	}
	if s.SSH.KnownHosts, err = p.Path("known_hosts", false); err != nil {
		return nil, err
	}
	ids, err := p.Strings("identity", false)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		abs, err := ResolvePath(p.Dir(), id)
		if err != nil {
			return nil, p.Errorf("identity", "%v", err)
		}
		s.SSH.Identity = append(s.SSH.Identity, abs)
	}
	return s, nil
}

func (s *transferStage) Params() any { return s }

// remoteResults marks stages whose results live outside the store: with
// --verify the runner runs them again instead of re-hashing their record.
type remoteResults interface{ remoteResults() }

func (s *transferStage) remoteResults() {}

// plan is what the stage sends: every output of every from stage.
func (s *transferStage) plan(env *Env) (*transfer.Plan, error) {
	p := &transfer.Plan{ChunkSize: transfer.DefaultChunkSize}
	for _, name := range s.From {
		in := env.Input(name)
		if in == nil {
			return nil, fmt.Errorf("transfer: input %q not given", name)
		}
		for _, o := range in.Outputs {
			local := filepath.Join(in.Dir, filepath.FromSlash(o.Path))
			if err := p.AddFile(local, path.Join(name, o.Path), o.Digest, o.Size); err != nil {
				return nil, fmt.Errorf("transfer: stage %s output %s: %w", name, o.Path, err)
			}
		}
	}
	return p, nil
}

func (s *transferStage) Plan(ctx context.Context, env *Env) (*StagePlan, error) {
	p, err := s.plan(env)
	if err != nil {
		return nil, err
	}
	return &StagePlan{
		Summary: fmt.Sprintf("%d files, %d bytes, to %d destinations", len(p.Files), p.Bytes(), len(s.dests)),
		// A chunk buffer per session, and one more, shared by the destinations.
		Memory: int64(s.Streams*s.Sessions+1)*p.ChunkSize + 16<<20,
	}, nil
}

// transferRecordFile is the stage's one output: a transferRecord.
const transferRecordFile = "transfer-record.json"

// maxTransferRecord bounds a transfer record status reads back.
const maxTransferRecord = 64 << 20

// transferRecord is the stage's stored output.
type transferRecord struct {
	Destinations []transferDest `json:"destinations"`
}

type transferDest struct {
	Destination string         `json:"destination"`
	HashCommand string         `json:"hash_command"`
	Files       []transferFile `json:"files"`
	// Extra is what the destination held under the stage directories that
	// the inputs do not (files the stage did not put there); Deleted, what
	// of it delete_extra removed.
	Extra   []string `json:"extra,omitempty"`
	Deleted []string `json:"deleted,omitempty"`
	// Netcheck is what the route and interface checks found before the
	// transfer (absent with skip_netcheck).
	Netcheck *netcheck.Summary `json:"netcheck,omitempty"`
}

type transferFile struct {
	Path     string          `json:"path"`
	Size     int64           `json:"size"`
	Digest   manifest.Digest `json:"digest"`
	Verified bool            `json:"verified"`
}

func (s *transferStage) Run(ctx context.Context, env *Env) (*Result, error) {
	p, err := s.plan(env)
	if err != nil {
		return nil, err
	}
	how := s.SSH.over(env.SSH)
	so := sshconn.Options{SSHConfigPath: how.Config, KnownHostsPath: how.KnownHosts, IdentityFiles: how.Identity}
	if s.Via != "" {
		b, err := netcheck.BindInterface(s.Via)
		if err != nil {
			return nil, fmt.Errorf("transfer: via: %w", err)
		}
		so.Control = b.Control // every SSH connection leaves by it
	}
	var dialer *sshconn.Dialer
	var dests []transfer.Destination
	for _, sd := range s.dests {
		switch {
		case sd.s3 != "":
			dests = append(dests, transfer.Destination{Name: sd.s3, Dir: sd.s3, S3: true})
			continue
		case sd.ssh == nil:
			dests = append(dests, transfer.Destination{Name: sd.local, Dir: sd.local, Local: true})
			continue
		}
		if dialer == nil {
			if dialer, err = sshconn.NewDialer(so); err != nil {
				return nil, err
			}
		}
		t, d := *sd.ssh, dialer
		dests = append(dests, transfer.Destination{Name: t.String(), Host: t.HostString(), Dir: t.Dir,
			Dial: func(ctx context.Context) (*ssh.Client, error) { return d.Dial(ctx, t) }})
	}
	state, err := env.WorkDir()
	if err != nil {
		return nil, err
	}
	env.Progress.SetTotal(p.Bytes() * int64(len(dests)))
	// What each destination was verified to hold outlives the stage's
	// work directory (removed with each commit): a run with other inputs
	// trusts what an earlier one left there instead of hashing it again.
	index, err := env.StateDir("transfer")
	if err != nil {
		return nil, err
	}
	o := transfer.Options{Streams: s.Streams, Sessions: s.Sessions, StateDir: state, IndexDir: index,
		Verify: env.Verify, DeleteExtra: s.DeleteExtra, Log: env.Log,
		Progress: func(string, int64) progress.Reporter { return transferProgress{env.Progress} }}
	checked := map[string]netcheck.Summary{} // by destination host
	var mu sync.Mutex
	if !s.SkipNetcheck {
		check := netcheck.PreFlight(dialer, netcheck.Options{Via: s.Via, ExpectMTU: int(s.ExpectMTU), RequireWired: s.RequireWired}, env.Log,
			func(host string, h netcheck.HostReport) {
				mu.Lock()
				checked[host] = h.Summary()
				mu.Unlock()
			})
		o.PreFlight = func(ctx context.Context, d transfer.Destination) error { return check(ctx, d.Host) }
	}
	rep, err := transfer.Run(ctx, p, dests, o)
	if rep != nil {
		for _, h := range rep.Hosts {
			env.Log.Info("transfer", "dest", h.Destination, "ok", h.OK, "sent", h.Sent, "seconds", h.Seconds, "mb_per_s", h.MBps, "verified_by", h.HashCommand)
		}
	}
	if err != nil {
		return nil, err
	}
	var rec transferRecord
	for _, h := range rep.Hosts {
		d := transferDest{Destination: h.Destination, HashCommand: h.HashCommand, Extra: h.Extra, Deleted: h.Deleted}
		if len(h.Extra) > 0 && len(h.Deleted) == 0 {
			env.Log.Warn(fmt.Sprintf("transfer: %d files at %s that the stage did not put there (delete_extra: true removes them)", len(h.Extra), h.Destination), "files", strings.Join(h.Extra, ", "))
		}
		if nc, ok := checked[h.Host]; ok {
			d.Netcheck = &nc
		}
		for _, f := range h.Files {
			d.Files = append(d.Files, transferFile{Path: f.Path, Size: f.Size, Digest: f.Digest, Verified: f.Verified})
		}
		sort.Slice(d.Files, func(i, j int) bool { return d.Files[i].Path < d.Files[j].Path })
		rec.Destinations = append(rec.Destinations, d)
	}
	var buf bytes.Buffer
	if err := jsonout.Write(&buf, rec); err != nil {
		return nil, err
	}
	dg, n, err := env.Ingest(&buf, int64(buf.Len()))
	if err != nil {
		return nil, err
	}
	return &Result{Outputs: []manifest.Output{{Path: transferRecordFile, Digest: dg, Size: n}}}, nil
}

// transferProgress adds every destination's bytes to the stage's one
// progress.
type transferProgress struct{ p Progress }

func (t transferProgress) SetTotal(int64) {}
func (t transferProgress) Add(n int64)    { t.p.Add(n) }
func (t transferProgress) Close() error   { return nil }
