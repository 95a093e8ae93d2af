//go:build linux || darwin

package netcheck

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// udpProber is a connected UDP socket with the don't-fragment bit set.
type udpProber struct {
	fd  int
	hdr int // IP + UDP header bytes
	buf []byte
}

func newProber(addr netip.Addr, port int, b Binding) (prober, error) {
	fam, hdr := unix.AF_INET, 20+8
	var sa unix.Sockaddr = &unix.SockaddrInet4{Port: port, Addr: addr.As4()}
	if addr.Is6() {
		fam, hdr = unix.AF_INET6, 40+8
		sa = &unix.SockaddrInet6{Port: port, Addr: addr.As16()}
	}
	fd, err := udpSocket(fam)
	if err != nil {
		return nil, err
	}
	p := &udpProber{fd: fd, hdr: hdr}
	if err := setDontFragment(fd, addr.Is6()); err != nil {
		p.close()
		return nil, fmt.Errorf("setting don't-fragment: %w", err)
	}
	if b.Iface != "" {
		if err := bindToInterface(fd, b, addr.Is6()); err != nil {
			p.close()
			return nil, fmt.Errorf("binding to %s: %w", b.Iface, err)
		}
		if b.Source.IsValid() {
			var la unix.Sockaddr = &unix.SockaddrInet4{Addr: b.Source.As4()}
			if b.Source.Is6() {
				la = &unix.SockaddrInet6{Addr: b.Source.As16()}
			}
			if err := unix.Bind(fd, la); err != nil {
				p.close()
				return nil, fmt.Errorf("binding to %s: %w", b.Source, err)
			}
		}
	}
	if err := unix.Connect(fd, sa); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

func (p *udpProber) close() error { return unix.Close(p.fd) }

func (p *udpProber) probe(size int, timeout time.Duration) (probeOutcome, int, time.Duration, error) {
	n := size - p.hdr
	if n < 0 {
		n = 0
	}
	if cap(p.buf) < n {
		p.buf = make([]byte, n)
	}
	// A late answer to an earlier probe is pending as the socket's error:
	// clear it, so that it is not taken for this probe's.
	_, _ = unix.GetsockoptInt(p.fd, unix.SOL_SOCKET, unix.SO_ERROR)
	start := time.Now()
	if err := unix.Send(p.fd, p.buf[:n], 0); err != nil {
		if errors.Is(err, unix.EMSGSIZE) {
			return probeTooBig, pathMTU(p.fd, p.hdr == 48), 0, nil
		}
		if errors.Is(err, unix.ECONNREFUSED) {
			// the error of an answer that came between the clear and the send
			if err = unix.Send(p.fd, p.buf[:n], 0); err == nil {
				goto wait
			}
		}
		if errors.Is(err, unix.EHOSTUNREACH) || errors.Is(err, unix.ENETUNREACH) {
			return probeLost, 0, 0, nil
		}
		return probeLost, 0, 0, fmt.Errorf("sending a %d-byte probe: %w", size, err)
	}
wait:
	deadline := start.Add(timeout)
	var rb [64]byte
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return probeLost, 0, 0, nil
		}
		fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
		k, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return probeLost, 0, 0, fmt.Errorf("waiting for a probe's answer: %w", err)
		}
		if k == 0 {
			continue
		}
		_, _, err = unix.Recvfrom(p.fd, rb[:], unix.MSG_DONTWAIT)
		took := time.Since(start)
		switch {
		case err == nil, errors.Is(err, unix.ECONNREFUSED):
			return probeReached, 0, took, nil
		case errors.Is(err, unix.EMSGSIZE):
			return probeTooBig, pathMTU(p.fd, p.hdr == 48), took, nil
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.EHOSTUNREACH), errors.Is(err, unix.ENETUNREACH):
			return probeLost, 0, took, nil
		default:
			return probeLost, 0, took, fmt.Errorf("reading a probe's answer: %w", err)
		}
	}
}
