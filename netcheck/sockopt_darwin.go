package netcheck

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// udpSocket: macOS has no SOCK_CLOEXEC; the descriptor is marked
// close-on-exec under syscall.ForkLock, as package net does, so that no
// process started meanwhile inherits it.
func udpSocket(family int) (int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	fd, err := unix.Socket(family, unix.SOCK_DGRAM, 0)
	if err != nil {
		return -1, err
	}
	unix.CloseOnExec(fd)
	return fd, nil
}

// setDontFragment sets DF on every datagram of fd (IP_DONTFRAG,
// IPV6_DONTFRAG); a send larger than the interface MTU fails with
// EMSGSIZE.
func setDontFragment(fd int, v6 bool) error {
	if v6 {
		return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_DONTFRAG, 1)
	}
	return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_DONTFRAG, 1)
}

// pathMTU: macOS has no IP_MTU socket option; the search goes on without
// a hint.
func pathMTU(int, bool) int { return 0 }

// bindToInterface pins socket fd to b's interface (IP_BOUND_IF,
// IPV6_BOUND_IF: the socket then uses that interface's scoped routes).
func bindToInterface(fd int, b Binding, v6 bool) error {
	if v6 {
		return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_BOUND_IF, b.Index)
	}
	return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_BOUND_IF, b.Index)
}
