// Package netcheck checks the network path to the hosts a transfer will
// reach before a byte is sent: the route the kernel would use (egress
// interface, source address, gateway, route MTU), every default route and
// which wins, whether the egress interface is Wi-Fi, its MTU and link
// speed, the path MTU to the host (a probe that needs no root), and the
// TCP round-trip time to the SSH port. Each problem becomes a Finding, one
// line that says what is wrong and what to do.
//
// Linux asks the kernel through rtnetlink (RTM_GETROUTE, so policy routing
// is honoured) and /sys/class/net; macOS runs and parses route(8),
// netstat(1), networksetup(8) and ifconfig(8). Via binds connections to an
// interface (ferry transfer --via).
package netcheck

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/ferry-llm/ferry/internal/errkind"
)

// Target is one host to check, as `ferry transfer` reaches it: Name is
// what the user typed (an ssh_config alias or a host name), Host the name
// or address to resolve (HostName from ssh_config, else Name), Port the
// SSH port (0: 22).
type Target struct {
	Name string
	Host string
	Port int
}

// Options are the requirements a check enforces.
type Options struct {
	// Via names the interface every connection must leave by; a host
	// with no route through it fails.
	Via string
	// ExpectMTU fails a host whose path MTU (or egress MTU) is not this.
	ExpectMTU int
	// RequireWired fails a host whose route leaves by Wi-Fi.
	RequireWired bool
	// RTTSamples is how many TCP connects time the SSH port (0: 3).
	RTTSamples int
	// NoProbe skips the path-MTU probe.
	NoProbe bool
}

// Report is the result of a check of several hosts.
type Report struct {
	Hosts    []HostReport   `json:"hosts"`
	Defaults []DefaultRoute `json:"default_routes"`
	// OK: every requirement holds for every host.
	OK bool `json:"ok"`
}

// HostReport is what netcheck found about one host.
type HostReport struct {
	Name     string     `json:"name"`
	Host     string     `json:"host"`
	Port     int        `json:"port"`
	Addr     string     `json:"addr,omitempty"`
	Addrs    []string   `json:"addrs,omitempty"`
	Error    string     `json:"error,omitempty"` // the host could not be resolved
	Route    *Route     `json:"route,omitempty"`
	Iface    *Interface `json:"iface,omitempty"`
	PathMTU  *PathMTU   `json:"path_mtu,omitempty"`
	RTT      *RTT       `json:"tcp_rtt,omitempty"`
	Findings []Finding  `json:"findings"`

	unknown bool // Error is an unknown host (exit 2), not a failed check
}

// Route is the route the kernel would use to reach a host.
type Route struct {
	Iface   string `json:"iface"`
	Index   int    `json:"index,omitempty"`
	Source  string `json:"source,omitempty"`
	Gateway string `json:"gateway,omitempty"`
	// MTU is the route's MTU: its own mtu metric, else the interface's.
	MTU int `json:"mtu,omitempty"`
	// Local: the address is this machine's own (delivered on loopback).
	Local bool `json:"local,omitempty"`
}

// DefaultRoute is one default route of the routing table.
type DefaultRoute struct {
	Family  string `json:"family"` // inet or inet6
	Iface   string `json:"iface"`
	Gateway string `json:"gateway,omitempty"`
	// Metric is the route's priority (Linux; lower wins). macOS has no
	// metrics: it is the order netstat lists the routes in.
	Metric int `json:"metric"`
	// Scoped: a macOS interface-scoped default (flag I), used only by
	// sockets bound to that interface.
	Scoped bool `json:"scoped,omitempty"`
	Wins   bool `json:"wins,omitempty"`
}

// Interface describes a network interface.
type Interface struct {
	Name  string `json:"name"`
	Index int    `json:"index,omitempty"`
	// Kind: wifi, ethernet, loopback, bridge, thunderbolt or virtual.
	Kind      string `json:"kind"`
	WiFi      bool   `json:"wifi"`
	MTU       int    `json:"mtu"`
	SpeedMbps int    `json:"speed_mbps,omitempty"` // 0: unknown
	Up        bool   `json:"up"`
}

// PathMTU is what the path-MTU probe measured.
type PathMTU struct {
	// MTU is the largest IP packet that reached the host (0: none did).
	MTU int `json:"mtu,omitempty"`
	// Exact: MTU+1 bytes did not reach it, or MTU is all the route
	// carries. When false, Below is the smallest size that did not.
	Exact  bool   `json:"exact"`
	Below  int    `json:"below,omitempty"`
	Probes int    `json:"probes"`
	Note   string `json:"note,omitempty"`
}

// RTT is the TCP connect time to the SSH port.
type RTT struct {
	Port    int       `json:"port"`
	Samples []float64 `json:"samples_ms,omitempty"`
	MinMS   float64   `json:"min_ms,omitempty"`
	MedMS   float64   `json:"median_ms,omitempty"`
	// Refused: nothing listens (the samples time the refusal).
	Refused bool   `json:"refused,omitempty"`
	Error   string `json:"error,omitempty"`
}

// Finding levels: a failed finding breaks a requirement (exit 3); a
// warning is advice.
const (
	Fail = "fail"
	Warn = "warn"
)

// Finding is one problem, worded as what is wrong and what to do.
type Finding struct {
	Level   string `json:"level"`
	Check   string `json:"check"`
	Message string `json:"message"`
}

// Err is the verdict of the report as an error for the CLI's exit code:
// nil when every requirement holds; a BadInput error (exit 2) when a host
// is unknown; a VerifyFailed error (exit 3) naming the first failed
// finding otherwise.
func (r *Report) Err() error {
	var firstFail *Finding
	var fails int
	for i := range r.Hosts {
		h := &r.Hosts[i]
		if h.unknown {
			return errkind.Errorf(errkind.BadInput, "netcheck: %s", h.Error)
		}
		for j := range h.Findings {
			if h.Findings[j].Level == Fail {
				fails++
				if firstFail == nil {
					firstFail = &h.Findings[j]
				}
			}
		}
	}
	if firstFail == nil {
		return nil
	}
	more := ""
	if fails > 1 {
		more = fmt.Sprintf(" (and %d more failed checks)", fails-1)
	}
	return errkind.Errorf(errkind.VerifyFailed, "netcheck: %s%s", firstFail.Message, more)
}

// ErrNoRouteVia is wrapped by the error of Via when no route to the host
// leaves through the interface.
var ErrNoRouteVia = errkind.New(errkind.VerifyFailed, "no route through that interface")

// errUnknownIface is wrapped when --via names an interface this machine
// does not have.
var errUnknownIface = errkind.New(errkind.Usage, "no such interface")

// sshPort is the port a Target without one is reached on.
const sshPort = 22

// Check checks every target. An error is returned only when the checks
// themselves could not run (no netlink socket, a command missing on
// macOS); findings, unknown hosts included, are in the report and in
// Report.Err.
func Check(ctx context.Context, targets []Target, opts Options) (*Report, error) {
	sys := newSystem()
	rep := &Report{OK: true}
	defs, err := sys.defaults(ctx)
	if err != nil {
		return nil, fmt.Errorf("netcheck: default routes: %w", err)
	}
	rep.Defaults = defs
	if opts.Via != "" {
		if _, err := sys.iface(ctx, opts.Via); err != nil {
			return nil, err
		}
	}
	for _, t := range targets {
		h, err := checkHost(ctx, sys, t, opts, defs)
		if err != nil {
			return nil, err
		}
		rep.Hosts = append(rep.Hosts, h)
	}
	rep.OK = rep.Err() == nil
	return rep, nil
}

// resolve returns the addresses of host, the one to use first (a literal
// address is itself).
func resolve(ctx context.Context, host string) (netip.Addr, []netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap(), []netip.Addr{a.Unmap()}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return netip.Addr{}, nil, err
	}
	if len(addrs) == 0 {
		return netip.Addr{}, nil, fmt.Errorf("no address for %s", host)
	}
	for i := range addrs {
		addrs[i] = addrs[i].Unmap()
	}
	return addrs[0], addrs, nil
}

func checkHost(ctx context.Context, sys system, t Target, opts Options, defs []DefaultRoute) (HostReport, error) {
	if t.Host == "" {
		t.Host = t.Name
	}
	if t.Port == 0 {
		t.Port = sshPort
	}
	h := HostReport{Name: t.Name, Host: t.Host, Port: t.Port, Findings: []Finding{}}
	who := t.Name
	addr, addrs, err := resolve(ctx, t.Host)
	if err != nil {
		h.unknown = true
		h.Error = fmt.Sprintf("unknown host %s: %v", t.Host, err)
		if t.Host != t.Name {
			h.Error = fmt.Sprintf("unknown host %s (HostName of %s): %v", t.Host, t.Name, err)
		}
		return h, nil
	}
	h.Addr = addr.String()
	for _, a := range addrs {
		h.Addrs = append(h.Addrs, a.String())
	}
	if who != h.Addr {
		who += " (" + h.Addr + ")"
	}
	add := func(level, check, format string, args ...any) {
		h.Findings = append(h.Findings, Finding{Level: level, Check: check, Message: fmt.Sprintf(format, args...)})
	}

	// The route: the kernel's own choice, or the one through --via.
	rt, err := sys.route(ctx, addr, "")
	if err != nil {
		var nr *noRouteError
		if errors.As(err, &nr) {
			add(Fail, "route", "no route to %s (%s): connect the link that reaches it, or add a route (%s)", who, nr.reason, addRouteHint(addr))
			return h, nil
		}
		return h, err
	}
	if opts.Via != "" {
		vrt, err := viaRoute(ctx, sys, addr, opts.Via, rt)
		switch {
		case rt.Local && errors.Is(err, ErrNoRouteVia):
			add(Fail, "via", "%s is this machine's own address, delivered by %s, not through %s: drop --via", who, rt.Iface, opts.Via)
			h.Route = &rt
			return h, nil
		case errors.Is(err, ErrNoRouteVia) || errors.Is(err, errNoRoute):
			add(Fail, "via", "no route to %s leaves through %s (the kernel would use %s): check that %s is up and on the host's network, or drop --via", who, opts.Via, rt.Iface, opts.Via)
			h.Route = &rt
			return h, nil
		case err != nil:
			return h, err
		}
		rt = vrt
	}
	h.Route = &rt
	ifc, err := sys.iface(ctx, rt.Iface)
	if err != nil {
		return h, err
	}
	h.Iface = &ifc
	if rt.MTU == 0 {
		rt.MTU = ifc.MTU
		h.Route.MTU = ifc.MTU
	}

	// A better interface that also reaches the host.
	if !rt.Local && opts.Via == "" {
		if better, err := betterPath(ctx, sys, addr, ifc); err != nil {
			return h, err
		} else if better != nil {
			level := Warn
			if opts.RequireWired && ifc.WiFi {
				level = Fail
			}
			add(level, "path", "route to %s leaves by %s while %s is up and reaches it too: run with --via %s, or %s", who, describe(ifc), describe(*better), better.Name, preferHint(*better, ifc))
		}
	}
	if opts.RequireWired && ifc.WiFi && !hasCheck(h.Findings, "path") {
		add(Fail, "wired", "route to %s leaves by %s and --require-wired is set: connect a wired link that reaches it (then run with --via IF)", who, describe(ifc))
	}

	// TCP first: its round-trip time sizes the probe's timeouts.
	rtt := measureRTT(ctx, addr, t.Port, opts.samples(), binding(opts.Via, rt))
	h.RTT = &rtt
	switch {
	case rtt.Refused:
		add(Warn, "ssh", "nothing listens on TCP port %d at %s (connection refused): is sshd running, and is %d its port?", t.Port, who, t.Port)
	case rtt.Error != "":
		add(Warn, "ssh", "TCP port %d at %s: %s: a firewall may drop it, or the host is down", t.Port, who, rtt.Error)
	}

	if !opts.NoProbe {
		pm, err := probePathMTU(ctx, addr, rt, binding(opts.Via, rt), rtt)
		if err != nil {
			return h, err
		}
		h.PathMTU = &pm
	}
	mtuFindings(&h, who, rt, ifc, opts, add)
	return h, nil
}

// viaRoute is the route to dst through interface via: ErrNoRouteVia when
// none leaves through it, or when dst is this machine's own address
// (direct, the route without via, is local: delivered on loopback, which
// no other interface carries, although the kernel would send it by a
// default route through via).
func viaRoute(ctx context.Context, sys system, dst netip.Addr, via string, direct Route) (Route, error) {
	if direct.Local && direct.Iface != via {
		return Route{}, fmt.Errorf("%s is this machine's own address, delivered by %s: %w", dst, direct.Iface, ErrNoRouteVia)
	}
	return sys.route(ctx, dst, via)
}

func (o Options) samples() int {
	if o.RTTSamples > 0 {
		return o.RTTSamples
	}
	return 3
}

func hasCheck(fs []Finding, check string) bool {
	for _, f := range fs {
		if f.Check == check {
			return true
		}
	}
	return false
}

// maxIPPacket is the largest IPv4 packet (and IPv6 packet without jumbo
// payload); a loopback MTU of 65536 carries all of it.
const maxIPPacket = 65535

// mtuFindings compares the interface MTU, the measured path MTU and
// --expect-mtu.
func mtuFindings(h *HostReport, who string, rt Route, ifc Interface, opts Options, add func(level, check, format string, args ...any)) {
	routeMTU := min(rt.MTU, maxIPPacket)
	pm := h.PathMTU
	measured := pm != nil && pm.MTU > 0
	if pm != nil && pm.MTU == 0 {
		level := Warn
		if opts.ExpectMTU > 0 {
			level = Fail
		}
		add(level, "pmtu", "no answer from %s to UDP probes (%s): path MTU not measured; allow ICMP port-unreachable from it, or check that it is up", who, pm.Note)
	}
	if measured && pm.MTU < routeMTU {
		add(Warn, "mtu", "%s MTU %d but path MTU to %s is %s: the other end or a switch is not set for %d-byte frames; set the same MTU on both ends and every switch between, or set %s to %d", rt.Iface, rt.MTU, who, pmtuString(*pm), rt.MTU, rt.Iface, pm.MTU)
	}
	if opts.ExpectMTU > 0 {
		switch {
		case ifc.MTU != opts.ExpectMTU:
			add(Fail, "expect-mtu", "%s MTU is %d, --expect-mtu %d: set it (%s)", ifc.Name, ifc.MTU, opts.ExpectMTU, setMTUHint(ifc.Name, opts.ExpectMTU))
		case measured && pm.MTU < min(opts.ExpectMTU, maxIPPacket): // no IP packet is larger than 65535
			add(Fail, "expect-mtu", "path MTU to %s is %s, --expect-mtu %d: the other end or a switch between is not set for %d-byte frames", who, pmtuString(*pm), opts.ExpectMTU, opts.ExpectMTU)
		}
	}
}

func pmtuString(p PathMTU) string {
	if p.Exact {
		return strconv.Itoa(p.MTU)
	}
	return fmt.Sprintf("at least %d (%d did not arrive)", p.MTU, p.Below)
}

// describe words an interface for a finding: "en1 (Wi-Fi, 866 Mbit/s)",
// "en8 (10 GbE, MTU 9000)".
func describe(i Interface) string {
	s := i.Name + " ("
	switch {
	case i.WiFi:
		s += "Wi-Fi"
		if i.SpeedMbps > 0 {
			s += fmt.Sprintf(", %d Mbit/s", i.SpeedMbps)
		}
	case i.SpeedMbps >= 1000 && i.SpeedMbps%1000 == 0 && i.Kind == "ethernet":
		s += fmt.Sprintf("%d GbE", i.SpeedMbps/1000)
	case i.SpeedMbps > 0:
		s += fmt.Sprintf("%s, %d Mbit/s", i.Kind, i.SpeedMbps)
	default:
		s += i.Kind
	}
	return s + fmt.Sprintf(", MTU %d)", i.MTU)
}

// betterPath returns an interface other than cur that is up, has a route
// to addr through it, and would carry a transfer better: wired where cur
// is Wi-Fi, else faster, else (same speed or unknown) a larger MTU.
func betterPath(ctx context.Context, sys system, addr netip.Addr, cur Interface) (*Interface, error) {
	all, err := sys.interfaces(ctx)
	if err != nil {
		return nil, err
	}
	var best *Interface
	for i := range all {
		c := all[i]
		if c.Name == cur.Name || !c.Up || c.Kind == "loopback" || !better(c, cur) {
			continue
		}
		if _, err := sys.route(ctx, addr, c.Name); err != nil {
			if errors.Is(err, ErrNoRouteVia) || errors.Is(err, errNoRoute) {
				continue
			}
			return nil, err
		}
		if best == nil || better(c, *best) {
			best = &all[i]
		}
	}
	return best, nil
}

// better says whether a would carry a transfer better than b.
func better(a, b Interface) bool {
	if a.WiFi != b.WiFi {
		return !a.WiFi
	}
	if a.SpeedMbps > 0 && b.SpeedMbps > 0 && a.SpeedMbps != b.SpeedMbps {
		return a.SpeedMbps > b.SpeedMbps
	}
	return a.MTU > b.MTU
}

// errNoRoute is matched (errors.Is) by a noRouteError: there is no route
// to a host at all.
var errNoRoute = errors.New("no route")

// noRouteError says why there is no route (the kernel's or route(8)'s
// words).
type noRouteError struct{ reason string }

func (e *noRouteError) Error() string        { return "no route: " + e.reason }
func (e *noRouteError) Is(target error) bool { return target == errNoRoute }

// system is what netcheck asks of the operating system.
type system interface {
	// route is the route to dst; through interface via when via != ""
	// (ErrNoRouteVia when none leaves through it). errNoRoute when there
	// is none at all.
	route(ctx context.Context, dst netip.Addr, via string) (Route, error)
	defaults(ctx context.Context) ([]DefaultRoute, error)
	iface(ctx context.Context, name string) (Interface, error)
	interfaces(ctx context.Context) ([]Interface, error)
}

// binding is how probes and connects leave by via (zero: no binding):
// the route through via says the source address.
func binding(via string, rt Route) Binding {
	if via == "" {
		return Binding{}
	}
	src, _ := netip.ParseAddr(rt.Source)
	return Binding{Iface: via, Index: rt.Index, Source: src}
}

func errUnknownHost(host string, err error) error {
	return errkind.Errorf(errkind.BadInput, "unknown host %s: %v", host, err)
}
