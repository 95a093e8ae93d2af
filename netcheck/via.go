package netcheck

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// Binding makes connections to one host leave through one interface: the
// source address the route through it uses, and the socket option that
// pins the egress interface (Linux SO_BINDTODEVICE, macOS IP_BOUND_IF).
// Binding the source address alone is not enough: a Linux host routes by
// destination (weak host model), so a socket bound to en8's address still
// leaves by the interface the kernel's route picks.
type Binding struct {
	Iface  string
	Index  int
	Source netip.Addr
}

// Via returns the Binding for reaching addr through interface iface. It
// fails with ErrNoRouteVia (errors.Is; exit 3) when no route to addr
// leaves through iface, and with a usage error (exit 2) when this machine
// has no interface of that name.
func Via(ctx context.Context, addr netip.Addr, iface string) (Binding, error) {
	sys := newSystem()
	if _, err := sys.iface(ctx, iface); err != nil {
		return Binding{}, err
	}
	direct, err := sys.route(ctx, addr.Unmap(), "")
	if err != nil {
		return Binding{}, fmt.Errorf("--via %s: %w", iface, err)
	}
	rt, err := viaRoute(ctx, sys, addr.Unmap(), iface, direct)
	if err != nil {
		return Binding{}, fmt.Errorf("--via %s: %w", iface, err)
	}
	b := binding(iface, rt)
	if !b.Source.IsValid() {
		return Binding{}, fmt.Errorf("--via %s: the route to %s through it has no source address: give %s an address", iface, addr, iface)
	}
	return b, nil
}

// BindInterface returns the Binding that pins sockets to interface
// name whatever host they reach (ferry transfer --via sets its Control on
// every SSH connection): no source address, the kernel takes that of the
// route through the interface. A name this machine has no interface of is
// a usage error (exit 2).
func BindInterface(name string) (Binding, error) {
	ifc, err := interfaceByName(name)
	if err != nil {
		return Binding{}, err
	}
	return Binding{Iface: ifc.Name, Index: ifc.Index}, nil
}

// ViaHost is Via for a host name or address (resolved first; an unknown
// host is bad input, exit 2).
func ViaHost(ctx context.Context, host, iface string) (Binding, error) {
	addr, _, err := resolve(ctx, host)
	if err != nil {
		return Binding{}, errUnknownHost(host, err)
	}
	return Via(ctx, addr, iface)
}

// LocalAddr is the source address for a TCP dial (port chosen by the
// kernel); nil for the zero Binding.
func (b Binding) LocalAddr() *net.TCPAddr {
	if !b.Source.IsValid() {
		return nil
	}
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(b.Source, 0))
}

// Control pins a socket to the Binding's interface; it fits
// net.Dialer.Control. The zero Binding does nothing.
func (b Binding) Control(network, address string, c syscall.RawConn) error {
	if b.Iface == "" {
		return nil
	}
	var serr error
	err := c.Control(func(fd uintptr) { serr = bindToInterface(int(fd), b, isIPv6(network, address)) })
	if err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("binding to %s: %w", b.Iface, serr)
	}
	return nil
}

// Dialer is a net.Dialer whose connections leave through the Binding's
// interface from its source address.
func (b Binding) Dialer(timeout time.Duration) *net.Dialer {
	d := &net.Dialer{Timeout: timeout, Control: b.Control}
	if la := b.LocalAddr(); la != nil {
		d.LocalAddr = la
	}
	return d
}

func isIPv6(network, address string) bool {
	switch network {
	case "tcp6", "udp6", "ip6":
		return true
	case "tcp4", "udp4", "ip4":
		return false
	}
	ap, err := netip.ParseAddrPort(address)
	return err == nil && !ap.Addr().Unmap().Is4()
}
