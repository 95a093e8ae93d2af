package netcheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// darwinSystem asks macOS's own tools: route(8) for the route the kernel
// would take (with -ifscope for one interface), netstat(1) for the default
// routes, networksetup(8) for which device is Wi-Fi, ifconfig(8) for
// status and link speed.
type darwinSystem struct {
	once  sync.Once
	ports map[string]string // device → hardware port name
	perr  error
}

func newSystem() system { return &darwinSystem{} }

// commandTimeout bounds each command netcheck runs.
const commandTimeout = 10 * time.Second

func run(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err := cmd.Run()
	if out.Len() > maxCommandOutput {
		return "", fmt.Errorf("%s: more than %d bytes of output", name, maxCommandOutput)
	}
	if err != nil {
		msg := strings.TrimSpace(stderr.String() + out.String())
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, msg)
	}
	return out.String(), nil
}

func (s *darwinSystem) route(ctx context.Context, dst netip.Addr, via string) (Route, error) {
	args := []string{"-n", "get"}
	if dst.Is6() {
		args = append(args, "-inet6")
	}
	if via != "" {
		if _, err := interfaceByName(via); err != nil {
			return Route{}, err
		}
		args = append(args, "-ifscope", via)
	}
	out, err := run(ctx, "route", append(args, dst.String())...)
	if err != nil {
		if strings.Contains(err.Error(), "not in table") {
			if via != "" {
				return Route{}, fmt.Errorf("%s through %s: %w", dst, via, ErrNoRouteVia)
			}
			return Route{}, &noRouteError{reason: "route get: not in table"}
		}
		return Route{}, err
	}
	rg, err := parseRouteGet(out)
	if err != nil {
		return Route{}, err
	}
	if via != "" && rg.Iface != via {
		return Route{}, fmt.Errorf("%s through %s: %w", dst, via, ErrNoRouteVia)
	}
	rt := Route{Iface: rg.Iface, MTU: rg.MTU}
	if ifc, err := net.InterfaceByName(rg.Iface); err == nil {
		rt.Index = ifc.Index
		rt.Local = ifc.Flags&net.FlagLoopback != 0
	}
	if a, err := netip.ParseAddr(rg.Gateway); err == nil {
		rt.Gateway = a.String()
	}
	// route(8) does not print the source address; a connected UDP socket
	// (which sends nothing) shows the one the kernel picks.
	if src, err := sourceFor(dst, Binding{Iface: via, Index: rt.Index}); err == nil {
		rt.Source = src.String()
	}
	return rt, nil
}

func sourceFor(dst netip.Addr, b Binding) (netip.Addr, error) {
	d := net.Dialer{Control: b.Control}
	c, err := d.Dial("udp", netip.AddrPortFrom(dst, probePort).String())
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	ap, err := netip.ParseAddrPort(c.LocalAddr().String())
	if err != nil {
		return netip.Addr{}, err
	}
	return ap.Addr().Unmap(), nil
}

func (s *darwinSystem) defaults(ctx context.Context) ([]DefaultRoute, error) {
	var all []DefaultRoute
	for _, fam := range []string{"inet", "inet6"} {
		out, err := run(ctx, "netstat", "-rn", "-f", fam)
		if err != nil {
			return nil, err
		}
		ds, err := parseNetstatDefaults(out)
		if err != nil {
			return nil, err
		}
		all = append(all, ds...)
	}
	return all, nil
}

func (s *darwinSystem) hardwarePorts(ctx context.Context) (map[string]string, error) {
	s.once.Do(func() {
		out, err := run(ctx, "networksetup", "-listallhardwareports")
		if err != nil {
			s.perr = err
			return
		}
		s.ports, s.perr = parseHardwarePorts(out)
	})
	return s.ports, s.perr
}

func (s *darwinSystem) iface(ctx context.Context, name string) (Interface, error) {
	ifc, err := interfaceByName(name)
	if err != nil {
		return Interface{}, err
	}
	return s.describe(ctx, *ifc)
}

func (s *darwinSystem) describe(ctx context.Context, ifc net.Interface) (Interface, error) {
	ports, err := s.hardwarePorts(ctx)
	if err != nil {
		return Interface{}, err
	}
	out, err := run(ctx, "ifconfig", "-v", ifc.Name)
	if err != nil {
		return Interface{}, err
	}
	all, err := parseIfconfig(out)
	if err != nil {
		return Interface{}, err
	}
	ic := all[ifc.Name]
	kind := darwinKind(ifc.Name, ports[ifc.Name], ic)
	up := ifc.Flags&net.FlagUp != 0 && ifc.Flags&net.FlagRunning != 0
	if ic.Media != "" && kind != "loopback" {
		up = up && ic.Active
	}
	return Interface{
		Name:      ifc.Name,
		Index:     ifc.Index,
		Kind:      kind,
		WiFi:      kind == "wifi",
		MTU:       ifc.MTU,
		SpeedMbps: ic.SpeedMbps,
		Up:        up,
	}, nil
}

func (s *darwinSystem) interfaces(ctx context.Context) ([]Interface, error) {
	all, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing interfaces: %w", err)
	}
	var out []Interface
	for _, ifc := range all {
		if ifc.Flags&net.FlagUp == 0 {
			continue // not a candidate; spare the ifconfig run
		}
		d, err := s.describe(ctx, ifc)
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				continue // vanished between the listing and ifconfig
			}
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

func interfaceByName(name string) (*net.Interface, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return nil, fmt.Errorf("interface %q: %w", name, errUnknownIface)
	}
	return ifc, nil
}

func addRouteHint(dst netip.Addr) string {
	return fmt.Sprintf("sudo route -n add -host %s GATEWAY", dst)
}

func preferHint(better, cur Interface) string {
	return fmt.Sprintf("move %s's service above %s's in the service order (System Settings › Network › Set Service Order, or networksetup -ordernetworkservices)", better.Name, cur.Name)
}

func setMTUHint(iface string, mtu int) string {
	return fmt.Sprintf("sudo networksetup -setMTU %s %d, and the same on the other end", iface, mtu)
}
