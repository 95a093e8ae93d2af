package netcheck

import "golang.org/x/sys/unix"

func udpSocket(family int) (int, error) {
	return unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
}

// setDontFragment sets path-MTU discovery to "do": the kernel sets DF,
// never fragments, and fails a send larger than the path MTU it knows
// with EMSGSIZE (ip(7) IP_MTU_DISCOVER, ipv6(7) IPV6_MTU_DISCOVER).
func setDontFragment(fd int, v6 bool) error {
	if v6 {
		return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
	}
	return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
}

// pathMTU is the path MTU the kernel knows for the connected socket fd
// (IP_MTU / IPV6_MTU), 0 if it cannot say.
func pathMTU(fd int, v6 bool) int {
	lvl, opt := unix.IPPROTO_IP, unix.IP_MTU
	if v6 {
		lvl, opt = unix.IPPROTO_IPV6, unix.IPV6_MTU
	}
	v, err := unix.GetsockoptInt(fd, lvl, opt)
	if err != nil {
		return 0
	}
	return v
}

// bindToInterface pins socket fd to b's interface (SO_BINDTODEVICE; no
// privilege needed since Linux 5.7 for a socket not bound yet).
func bindToInterface(fd int, b Binding, _ bool) error {
	return unix.BindToDevice(fd, b.Iface)
}
