package netcheck

import (
	"context"
	"log/slog"

	"github.com/ferry-llm/ferry/transfer/sshconn"
)

// SSHTarget is the Target for an SSH endpoint as sshconn resolved it from
// the user's ssh_config (alias → HostName, Port): the host this machine's
// connection really goes to. With ProxyJump that is the first jump host,
// the only one whose route, interface and path MTU are this machine's
// business; Name then says so.
func SSHTarget(e *sshconn.Endpoint) Target {
	first := e
	for range maxJumpHops {
		if len(first.Jumps) == 0 {
			break
		}
		first = first.Jumps[0]
	}
	t := Target{Name: e.Name, Host: first.HostName, Port: first.Port}
	if first != e {
		t.Name = e.Name + ", first hop " + first.Name
	}
	return t
}

// maxJumpHops bounds the walk down a ProxyJump chain (sshconn bounds the
// chain itself; this only keeps the loop finite).
const maxJumpHops = 16

// PreFlight is the check ferry transfer and the transfer stage run before
// a byte goes to a destination: the host ([user@]host[:port]) resolved
// through d as the transfer's own connections resolve it, checked with
// opts. Warnings go to log; each host's report goes to record (when not
// nil); the error is the verdict (Report.Err: a failed requirement with
// its remedy, exit 3; an unknown host, exit 2) or what kept the check
// from running.
func PreFlight(d *sshconn.Dialer, opts Options, log *slog.Logger, record func(host string, h HostReport)) func(ctx context.Context, host string) error {
	return func(ctx context.Context, host string) error {
		t, err := sshconn.ParseHost(host)
		if err != nil {
			return err
		}
		e, err := d.Resolve(t)
		if err != nil {
			return err
		}
		rep, err := Check(ctx, []Target{SSHTarget(e)}, opts)
		if err != nil {
			return err
		}
		h := rep.Hosts[0]
		if record != nil {
			record(host, h)
		}
		for _, f := range h.Findings {
			if f.Level == Warn {
				log.Warn("netcheck: "+f.Message, "host", host)
			}
		}
		return rep.Err()
	}
}

// Summary is what a stage record keeps of a HostReport: what was checked
// and found, without the timings that change from run to run.
type Summary struct {
	Host     string    `json:"host"`
	Addr     string    `json:"addr,omitempty"`
	Iface    string    `json:"iface,omitempty"`
	Kind     string    `json:"kind,omitempty"`
	Source   string    `json:"source,omitempty"`
	RouteMTU int       `json:"route_mtu,omitempty"`
	PathMTU  int       `json:"path_mtu,omitempty"`
	Findings []Finding `json:"findings,omitempty"`
}

// Summary is h without its timings.
func (h HostReport) Summary() Summary {
	s := Summary{Host: h.Name, Addr: h.Addr, Findings: h.Findings}
	if h.Route != nil {
		s.Iface, s.Source, s.RouteMTU = h.Route.Iface, h.Route.Source, h.Route.MTU
	}
	if h.Iface != nil {
		s.Kind = h.Iface.Kind
	}
	if h.PathMTU != nil {
		s.PathMTU = h.PathMTU.MTU
	}
	return s
}
