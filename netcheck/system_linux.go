package netcheck

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

type linuxSystem struct {
	sysfs string
}

func newSystem() system { return linuxSystem{sysfs: "/sys/class/net"} }

func (s linuxSystem) route(_ context.Context, dst netip.Addr, via string) (Route, error) {
	oif := 0
	if via != "" {
		ifc, err := interfaceByName(via)
		if err != nil {
			return Route{}, err
		}
		oif = ifc.Index
	}
	r, err := kernelRoute(dst, oif)
	if err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			switch errno {
			case syscall.ENETUNREACH, syscall.EHOSTUNREACH, syscall.EACCES, syscall.EINVAL:
				// unreachable, prohibit and blackhole routes, or none
				return Route{}, &noRouteError{reason: "RTM_GETROUTE: " + errno.Error()}
			}
		}
		return Route{}, fmt.Errorf("route to %s: %w", dst, err)
	}
	if oif > 0 && (r.Table == 0 || r.Oif != oif) {
		// Table 0: no route matched, the kernel only assumed dst is on
		// via's link (ip_route_output_key_hash_rcu does that for any
		// lookup with an output interface).
		return Route{}, fmt.Errorf("%s through %s: %w", dst, via, ErrNoRouteVia)
	}
	rt := Route{Index: r.Oif, MTU: r.MTU, Local: r.Type == rtnLocal}
	if r.PrefSrc.IsValid() {
		rt.Source = r.PrefSrc.String()
	}
	if r.Gateway.IsValid() {
		rt.Gateway = r.Gateway.String()
	}
	if ifc, err := net.InterfaceByIndex(r.Oif); err == nil {
		rt.Iface = ifc.Name
	} else {
		rt.Iface = fmt.Sprintf("if%d", r.Oif)
	}
	return rt, nil
}

func (s linuxSystem) defaults(context.Context) ([]DefaultRoute, error) {
	rs, err := kernelDefaultRoutes()
	if err != nil {
		return nil, err
	}
	var out []DefaultRoute
	for _, r := range rs {
		fam := "inet"
		if r.Family == afInet6 {
			fam = "inet6"
		}
		hops := r.Nexthops
		if len(hops) == 0 {
			hops = []nlNexthop{{Oif: r.Oif, Gateway: r.Gateway}}
		}
		for _, h := range hops {
			d := DefaultRoute{Family: fam, Iface: ifaceName(h.Oif), Metric: int(r.Priority)}
			if h.Gateway.IsValid() {
				d.Gateway = h.Gateway.String()
			}
			out = append(out, d)
		}
	}
	markWinners(out)
	return out, nil
}

// markWinners marks, per family, the default route with the lowest
// metric (the first of equals, as the kernel's FIB keeps them in order).
func markWinners(ds []DefaultRoute) {
	best := map[string]int{}
	for i, d := range ds {
		if j, ok := best[d.Family]; !ok || d.Metric < ds[j].Metric {
			best[d.Family] = i
		}
	}
	for _, i := range best {
		ds[i].Wins = true
	}
}

func ifaceName(index int) string {
	if ifc, err := net.InterfaceByIndex(index); err == nil {
		return ifc.Name
	}
	return fmt.Sprintf("if%d", index)
}

func interfaceByName(name string) (*net.Interface, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return nil, fmt.Errorf("interface %q: %w", name, errUnknownIface)
	}
	return ifc, nil
}

func (s linuxSystem) iface(_ context.Context, name string) (Interface, error) {
	ifc, err := interfaceByName(name)
	if err != nil {
		return Interface{}, err
	}
	return s.describe(*ifc), nil
}

func (s linuxSystem) describe(ifc net.Interface) Interface {
	sf := readSysfs(s.sysfs, ifc.Name)
	return Interface{
		Name:      ifc.Name,
		Index:     ifc.Index,
		Kind:      sf.Kind,
		WiFi:      sf.WiFi,
		MTU:       ifc.MTU,
		SpeedMbps: sf.SpeedMbps,
		Up:        ifc.Flags&net.FlagUp != 0 && ifc.Flags&net.FlagRunning != 0,
	}
}

func (s linuxSystem) interfaces(context.Context) ([]Interface, error) {
	all, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing interfaces: %w", err)
	}
	out := make([]Interface, 0, len(all))
	for _, ifc := range all {
		out = append(out, s.describe(ifc))
	}
	return out, nil
}

func addRouteHint(dst netip.Addr) string {
	return fmt.Sprintf("ip route add %s via GATEWAY dev IF", netip.PrefixFrom(dst, dst.BitLen()))
}

func preferHint(better, cur Interface) string {
	return fmt.Sprintf("give %s's route a lower metric than %s's (ip route change … dev %s metric N)", better.Name, cur.Name, better.Name)
}

func setMTUHint(iface string, mtu int) string {
	return fmt.Sprintf("ip link set %s mtu %d, and the same on the other end", iface, mtu)
}
