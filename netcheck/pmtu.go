package netcheck

import (
	"context"
	"fmt"
	"net/netip"
	"time"
)

// The path-MTU probe needs no root: DF-set UDP datagrams of chosen sizes
// on a connected socket, sent to a port nothing listens on. A datagram
// that reaches the host draws an ICMP port-unreachable, which a connected
// UDP socket reports as ECONNREFUSED; one too big for the local route (or
// for a router that answered with "fragmentation needed") fails with
// EMSGSIZE, and the kernel's path MTU is then readable (Linux IP_MTU); one
// dropped on the way (a link or switch with a smaller MTU drops it
// silently) draws nothing. The search keeps the largest size that arrived
// and the smallest that did not until they meet.
//
// Hosts rate-limit ICMP errors (Linux: a burst of 6, then one a second,
// per peer), so the search spends few arriving probes: a baseline, the
// full route MTU, then the common MTU plateaus before bisecting.

// probePort is where the probes go: the first port traceroute uses,
// conventionally closed.
const probePort = 33434

type probeOutcome int

const (
	probeLost    probeOutcome = iota // no answer before the timeout
	probeReached                     // the host answered (port unreachable, or a reply)
	probeTooBig                      // EMSGSIZE: larger than the path MTU the kernel knows
)

// prober sends one DF probe of size bytes (the whole IP packet) and says
// what became of it; for probeTooBig, hint is the path MTU the kernel
// now knows (0: unknown).
type prober interface {
	probe(size int, timeout time.Duration) (out probeOutcome, hint int, rtt time.Duration, err error)
	close() error
}

// Search bounds: the probe sends at most maxProbes datagrams, at most
// maxArrived of which may arrive: each costs the host an ICMP error, and a
// Linux host sends a burst of 6 to one peer before it limits them, so a
// seventh answer could be suppressed and its probe taken for too big.
// Past the budget the result is a range (MTU, Below).
const (
	maxProbes  = 24
	maxArrived = 6
	// probeFirstTimeout is the wait for the baseline probe, before any
	// round-trip time is known; later waits scale with the RTT.
	probeFirstTimeout = time.Second
	probeMinTimeout   = 100 * time.Millisecond
	probeMaxTimeout   = time.Second
)

// mtuPlateaus are the MTUs links are commonly set to, tried first.
var mtuPlateaus = []int{9000, 1500, 1492, 1280}

func probePathMTU(ctx context.Context, addr netip.Addr, rt Route, b Binding, tcp RTT) (PathMTU, error) {
	p, err := newProber(addr, probePort, b)
	if err != nil {
		return PathMTU{}, fmt.Errorf("path-MTU probe to %s: %w", addr, err)
	}
	defer p.close()
	top := min(rt.MTU, maxIPPacket)
	floor := 576 // the smallest datagram every IPv4 host must accept (RFC 791)
	if addr.Is6() {
		floor = 1280 // IPv6's minimum link MTU (RFC 8200)
	}
	floor = min(floor, top)
	var rtt time.Duration
	if tcp.MinMS > 0 {
		rtt = time.Duration(tcp.MinMS * float64(time.Millisecond))
	}
	return searchPMTU(ctx, p, floor, top, rtt)
}

// searchPMTU finds the path MTU between floor and top with p.
func searchPMTU(ctx context.Context, p prober, floor, top int, rtt time.Duration) (PathMTU, error) {
	res := PathMTU{}
	arrived := 0
	send := func(size int, timeout time.Duration) (probeOutcome, int, error) {
		res.Probes++
		out, hint, took, err := p.probe(size, timeout)
		if out == probeReached {
			arrived++
			rtt = max(rtt, took)
		}
		return out, hint, err
	}
	// The baseline: does the host answer at all?
	var out probeOutcome
	for try := 0; try < 2 && out != probeReached; try++ {
		o, _, err := send(floor, probeFirstTimeout)
		if err != nil {
			return res, err
		}
		out = o
	}
	if out != probeReached {
		res.Note = fmt.Sprintf("%d-byte probes got no answer in %s", floor, probeFirstTimeout)
		return res, nil
	}
	timeout := min(max(4*rtt+20*time.Millisecond, probeMinTimeout), probeMaxTimeout)
	lo, hi := floor, top+1 // lo arrived; hi is the smallest size known not to
	tried := map[int]bool{floor: true}
	next := top
	confirmed := false
	for lo+1 < hi {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if res.Probes >= maxProbes || arrived >= maxArrived {
			res.Note = "probe budget spent"
			break
		}
		tried[next] = true
		out, hint, err := send(next, timeout)
		if err != nil {
			return res, err
		}
		switch out {
		case probeReached:
			lo = next
		case probeLost:
			hi = next
		case probeTooBig:
			hi = next
			if hint > lo && hint < hi && !tried[hint] {
				next = hint
				continue
			}
		}
		if lo+1 >= hi && hi <= top && !confirmed {
			// One lost datagram decides the answer: send it again, in
			// case it was lost to something other than its size.
			confirmed = true
			if o, _, err := send(hi, timeout); err != nil {
				return res, err
			} else if o == probeReached {
				lo, hi = hi, top+1
			}
		}
		next = nextProbe(lo, hi, tried)
	}
	res.MTU = lo
	res.Exact = lo+1 >= hi
	if !res.Exact {
		res.Below = hi
	}
	if res.Exact && lo < top {
		// A receiver admits frames up to its MTU plus a VLAN tag (Linux
		// is_skb_forwardable, and NICs alike), so up to 4 bytes more
		// than the MTU it is set to arrive: that MTU is the answer.
		for _, p := range mtuPlateaus {
			if lo > p && lo <= p+vlanTagLen {
				res.Note = fmt.Sprintf("%d-byte datagrams arrived: the receiver's %d-byte VLAN-tag allowance above MTU %d", lo, vlanTagLen, p)
				res.MTU = p
			}
		}
	}
	return res, nil
}

// vlanTagLen is the 802.1Q tag a receiver admits above its MTU.
const vlanTagLen = 4

// nextProbe is the largest untried plateau strictly between lo and hi,
// else their midpoint.
func nextProbe(lo, hi int, tried map[int]bool) int {
	for _, p := range mtuPlateaus { // descending
		if p > lo && p < hi && !tried[p] {
			return p
		}
	}
	return lo + (hi-lo)/2
}
