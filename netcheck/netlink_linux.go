package netcheck

import (
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// nlSeq numbers requests so that a stray answer (to an earlier request on
// a socket reused by the kernel's port id) is never taken for ours.
var nlSeq atomic.Uint32

// nlQuery sends one rtnetlink request on a fresh socket and hands every
// answering message to fn until the answer is complete: one message for a
// plain request, NLMSG_DONE for a dump. An NLMSG_ERROR with a nonzero
// errno ends it with that errno.
func nlQuery(req []byte, seq uint32, dump bool, fn func(nlMessage) error) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink bind: %w", err)
	}
	// The kernel answers at once; a reply that does not come in 5 s is a
	// kernel or sandbox problem, not something to wait on forever.
	tv := unix.Timeval{Sec: 5}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fmt.Errorf("netlink SO_RCVTIMEO: %w", err)
	}
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink send: %w", err)
	}
	buf := make([]byte, 64<<10)
	total := 0
	for {
		n, from, err := unix.Recvfrom(fd, buf, unix.MSG_TRUNC)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("netlink receive: %w", err)
		}
		if n > len(buf) {
			return fmt.Errorf("netlink: a %d-byte reply does not fit the %d-byte buffer", n, len(buf))
		}
		if sa, ok := from.(*unix.SockaddrNetlink); !ok || sa.Pid != 0 {
			continue // not from the kernel
		}
		if total += n; total > maxNLBytes {
			return fmt.Errorf("netlink: reply larger than %d bytes", maxNLBytes)
		}
		msgs, err := parseNLMessages(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Seq != seq {
				continue
			}
			switch m.Type {
			case nlmsgDone:
				return nil
			case nlmsgError:
				e, err := nlErrno(m.Data)
				if err != nil {
					return err
				}
				if e != 0 {
					return syscall.Errno(-e)
				}
				if !dump {
					return nil
				}
			case nlmsgNoop:
			default:
				if err := fn(m); err != nil {
					return err
				}
				if !dump {
					return nil
				}
			}
		}
	}
}

// kernelRoute asks the kernel for the route to dst (RTM_GETROUTE, the
// answer `ip route get` prints), constrained to interface oif when
// oif > 0.
func kernelRoute(dst netip.Addr, oif int) (nlRoute, error) {
	seq := nlSeq.Add(1)
	var r nlRoute
	var got bool
	err := nlQuery(nlGetRouteRequest(seq, dst, oif), seq, false, func(m nlMessage) error {
		if m.Type != rtmNewRoute {
			return fmt.Errorf("netlink: answer of type %d to RTM_GETROUTE", m.Type)
		}
		var err error
		r, err = parseNLRoute(m.Data)
		got = err == nil
		return err
	})
	if err == nil && !got {
		err = errors.New("netlink: RTM_GETROUTE was acknowledged without a route")
	}
	return r, err
}

// kernelDefaultRoutes lists the default routes (0.0.0.0/0 and ::/0, type
// unicast) of the main table, in the kernel's order.
func kernelDefaultRoutes() ([]nlRoute, error) {
	var out []nlRoute
	for _, fam := range []byte{afInet, afInet6} {
		seq := nlSeq.Add(1)
		err := nlQuery(nlDumpRoutesRequest(seq, fam), seq, true, func(m nlMessage) error {
			if m.Type != rtmNewRoute {
				return nil
			}
			r, err := parseNLRoute(m.Data)
			if err != nil {
				return err
			}
			if r.DstLen == 0 && r.Type == rtnUnicast && r.Table == rtTableMain {
				out = append(out, r)
			}
			return nil
		})
		if err != nil && !(fam == afInet6 && errors.Is(err, unix.EAFNOSUPPORT)) {
			return nil, err
		}
	}
	return out, nil
}
