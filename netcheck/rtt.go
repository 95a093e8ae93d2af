package netcheck

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"syscall"
	"time"
)

// rttTimeout bounds one TCP connect to the SSH port.
const rttTimeout = 3 * time.Second

// measureRTT times n TCP connects to addr:port (through b when it is
// set). A refused connect still times the round trip (SYN out, RST back);
// a connect that fails otherwise ends the measurement.
func measureRTT(ctx context.Context, addr netip.Addr, port, n int, b Binding) RTT {
	r := RTT{Port: port}
	d := b.Dialer(rttTimeout)
	target := netip.AddrPortFrom(addr, uint16(port)).String()
	for range n {
		start := time.Now()
		c, err := d.DialContext(ctx, "tcp", target)
		el := time.Since(start)
		switch {
		case err == nil:
			c.Close()
		case errors.Is(err, syscall.ECONNREFUSED):
			r.Refused = true
		default:
			r.Error = shortNetError(err)
			return finishRTT(r)
		}
		r.Samples = append(r.Samples, float64(el.Microseconds())/1000)
	}
	return finishRTT(r)
}

func finishRTT(r RTT) RTT {
	if len(r.Samples) == 0 {
		return r
	}
	s := slices.Clone(r.Samples)
	slices.Sort(s)
	r.MinMS, r.MedMS = s[0], s[len(s)/2]
	return r
}

// shortNetError is the innermost words of a dial error ("i/o timeout",
// "no route to host"), without the addresses the caller already prints.
func shortNetError(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "no answer in " + rttTimeout.String()
	}
	var te interface{ Timeout() bool }
	if errors.As(err, &te) && te.Timeout() {
		return "no answer in " + rttTimeout.String()
	}
	return err.Error()
}
