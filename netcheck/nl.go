package netcheck

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// The rtnetlink wire format, as far as netcheck speaks it: requests for one
// route (RTM_GETROUTE, what `ip route get` sends) and for a dump of the
// routing table, and the RTM_NEWROUTE / NLMSG_ERROR / NLMSG_DONE answers.
// The encoding and parsing are plain Go with no syscalls, so they build and
// are fuzzed on every platform; only the socket is Linux's
// (netlink_linux.go). Netlink is host byte order. Constants from
// include/uapi/linux/{netlink,rtnetlink}.h.
const (
	nlmsgHdrLen = 16 // struct nlmsghdr: len u32, type u16, flags u16, seq u32, pid u32
	rtmsgLen    = 12 // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type u8; flags u32
	rtaHdrLen   = 4  // struct rtattr: len u16, type u16

	nlmsgNoop  = 1
	nlmsgError = 2
	nlmsgDone  = 3

	nlmFRequest = 0x1
	nlmFMulti   = 0x2
	nlmFAck     = 0x4
	nlmFDump    = 0x300 // NLM_F_ROOT | NLM_F_MATCH

	rtmNewRoute = 24
	rtmGetRoute = 26

	rtaDst       = 1
	rtaOif       = 4
	rtaGateway   = 5
	rtaPriority  = 6
	rtaPrefSrc   = 7
	rtaMetrics   = 8
	rtaMultipath = 9
	rtaTable     = 15

	rtaxMTU = 2 // inside RTA_METRICS

	rtmFLookupTable = 0x1000 // RTM_F_LOOKUP_TABLE: report the table the lookup matched, 0 for none

	rtnUnicast = 1
	rtnLocal   = 2

	rtTableMain = 254

	afInet  = 2
	afInet6 = 10
)

// Bounds on what a reply may make netcheck hold: a routing table dump of
// a full BGP feed is ~1M routes, far more than a host that runs ferry has;
// past these the reply is refused rather than buffered.
const (
	maxNLMessages = 1 << 16
	maxNLBytes    = 32 << 20
	maxNexthops   = 256
)

var errNLTruncated = errors.New("netlink: truncated message")

// nlMessage is one netlink message: its header fields and payload.
type nlMessage struct {
	Type  uint16
	Flags uint16
	Seq   uint32
	Pid   uint32
	Data  []byte // aliases the buffer it was parsed from
}

// parseNLMessages splits a datagram read from a netlink socket into its
// messages. Every length is checked against what is left before it is
// used; messages are 4-byte aligned.
func parseNLMessages(b []byte) ([]nlMessage, error) {
	var msgs []nlMessage
	for len(b) > 0 {
		if len(b) < nlmsgHdrLen {
			return nil, fmt.Errorf("%w: %d bytes left, a header needs %d", errNLTruncated, len(b), nlmsgHdrLen)
		}
		n := binary.NativeEndian.Uint32(b[0:4])
		if n < nlmsgHdrLen || uint64(n) > uint64(len(b)) {
			return nil, fmt.Errorf("%w: message length %d with %d bytes left", errNLTruncated, n, len(b))
		}
		if len(msgs) == maxNLMessages {
			return nil, fmt.Errorf("netlink: more than %d messages in one datagram", maxNLMessages)
		}
		msgs = append(msgs, nlMessage{
			Type:  binary.NativeEndian.Uint16(b[4:6]),
			Flags: binary.NativeEndian.Uint16(b[6:8]),
			Seq:   binary.NativeEndian.Uint32(b[8:12]),
			Pid:   binary.NativeEndian.Uint32(b[12:16]),
			Data:  b[nlmsgHdrLen:n],
		})
		adv := nlAlign(int(n))
		if adv > len(b) {
			adv = len(b)
		}
		b = b[adv:]
	}
	return msgs, nil
}

func nlAlign(n int) int { return (n + 3) &^ 3 }

// nlErrno is the error an NLMSG_ERROR message carries: 0 is an
// acknowledgement, else a negated errno.
func nlErrno(data []byte) (int32, error) {
	if len(data) < 4 {
		return 0, fmt.Errorf("%w: NLMSG_ERROR with %d bytes", errNLTruncated, len(data))
	}
	return int32(binary.NativeEndian.Uint32(data[0:4])), nil
}

// rtAttr is one route attribute: its type and payload.
type rtAttr struct {
	Type uint16
	Data []byte
}

// parseRTAttrs splits a run of rtattrs. Like the kernel's
// nla_for_each_attr it refuses an attribute whose length runs past the
// buffer.
func parseRTAttrs(b []byte) ([]rtAttr, error) {
	var attrs []rtAttr
	for len(b) >= rtaHdrLen {
		n := int(binary.NativeEndian.Uint16(b[0:2]))
		if n < rtaHdrLen || n > len(b) {
			return nil, fmt.Errorf("%w: attribute length %d with %d bytes left", errNLTruncated, n, len(b))
		}
		attrs = append(attrs, rtAttr{Type: binary.NativeEndian.Uint16(b[2:4]) & 0x3fff, Data: b[rtaHdrLen:n]})
		adv := nlAlign(n)
		if adv > len(b) {
			adv = len(b)
		}
		b = b[adv:]
	}
	return attrs, nil
}

// nlRoute is an RTM_NEWROUTE message, decoded.
type nlRoute struct {
	Family   uint8
	DstLen   uint8
	Table    uint32 // RTA_TABLE when present, else rtm_table
	Protocol uint8
	Scope    uint8
	Type     uint8
	Flags    uint32
	Dst      netip.Addr
	Gateway  netip.Addr
	PrefSrc  netip.Addr
	Oif      int
	Priority uint32 // the route's metric
	HasPrio  bool
	MTU      int // RTAX_MTU in RTA_METRICS; 0 when the route sets none
	Nexthops []nlNexthop
}

// nlNexthop is one path of a multipath route (RTA_MULTIPATH).
type nlNexthop struct {
	Oif     int
	Gateway netip.Addr
	Weight  int // rtnh_hops + 1, as `ip route` prints it
}

// parseNLRoute decodes the payload of an RTM_NEWROUTE message.
func parseNLRoute(data []byte) (nlRoute, error) {
	if len(data) < rtmsgLen {
		return nlRoute{}, fmt.Errorf("%w: rtmsg with %d bytes", errNLTruncated, len(data))
	}
	r := nlRoute{
		Family:   data[0],
		DstLen:   data[1],
		Table:    uint32(data[4]),
		Protocol: data[5],
		Scope:    data[6],
		Type:     data[7],
		Flags:    binary.NativeEndian.Uint32(data[8:12]),
	}
	attrs, err := parseRTAttrs(data[rtmsgLen:])
	if err != nil {
		return nlRoute{}, err
	}
	for _, a := range attrs {
		switch a.Type {
		case rtaDst:
			r.Dst = nlAddr(a.Data)
		case rtaGateway:
			r.Gateway = nlAddr(a.Data)
		case rtaPrefSrc:
			r.PrefSrc = nlAddr(a.Data)
		case rtaOif:
			if len(a.Data) >= 4 {
				r.Oif = int(int32(binary.NativeEndian.Uint32(a.Data)))
			}
		case rtaPriority:
			if len(a.Data) >= 4 {
				r.Priority, r.HasPrio = binary.NativeEndian.Uint32(a.Data), true
			}
		case rtaTable:
			if len(a.Data) >= 4 {
				r.Table = binary.NativeEndian.Uint32(a.Data)
			}
		case rtaMetrics:
			metrics, err := parseRTAttrs(a.Data)
			if err != nil {
				return nlRoute{}, fmt.Errorf("RTA_METRICS: %w", err)
			}
			for _, m := range metrics {
				if m.Type == rtaxMTU && len(m.Data) >= 4 {
					r.MTU = int(binary.NativeEndian.Uint32(m.Data))
				}
			}
		case rtaMultipath:
			nh, err := parseNexthops(a.Data)
			if err != nil {
				return nlRoute{}, err
			}
			r.Nexthops = nh
		}
	}
	return r, nil
}

// parseNexthops decodes RTA_MULTIPATH: struct rtnexthop (len u16, flags
// u8, hops u8, ifindex i32) followed by that hop's attributes.
func parseNexthops(b []byte) ([]nlNexthop, error) {
	var hops []nlNexthop
	for len(b) >= 8 {
		n := int(binary.NativeEndian.Uint16(b[0:2]))
		if n < 8 || n > len(b) {
			return nil, fmt.Errorf("%w: RTA_MULTIPATH hop length %d with %d bytes left", errNLTruncated, n, len(b))
		}
		if len(hops) == maxNexthops {
			return nil, fmt.Errorf("netlink: more than %d nexthops in one route", maxNexthops)
		}
		h := nlNexthop{Weight: int(b[3]) + 1, Oif: int(int32(binary.NativeEndian.Uint32(b[4:8])))}
		attrs, err := parseRTAttrs(b[8:n])
		if err != nil {
			return nil, fmt.Errorf("RTA_MULTIPATH: %w", err)
		}
		for _, a := range attrs {
			if a.Type == rtaGateway {
				h.Gateway = nlAddr(a.Data)
			}
		}
		hops = append(hops, h)
		adv := nlAlign(n)
		if adv > len(b) {
			adv = len(b)
		}
		b = b[adv:]
	}
	return hops, nil
}

// nlAddr is an IPv4 or IPv6 address attribute; anything else is the zero
// Addr.
func nlAddr(b []byte) netip.Addr {
	switch len(b) {
	case 4:
		return netip.AddrFrom4([4]byte(b))
	case 16:
		return netip.AddrFrom16([16]byte(b))
	}
	return netip.Addr{}
}

// nlGetRouteRequest builds the RTM_GETROUTE request for the route to dst,
// constrained to leave by interface oif when oif > 0 (RTA_OIF, as `ip
// route get DST oif IF`). It asks for the table that matched
// (RTM_F_LOOKUP_TABLE) so that a lookup the kernel answered only by
// assuming dst is on oif's link (there is no route through oif) shows as
// table 0.
func nlGetRouteRequest(seq uint32, dst netip.Addr, oif int) []byte {
	fam, bits := byte(afInet), byte(32)
	if !dst.Is4() {
		fam, bits = afInet6, 128
	}
	raw := dst.AsSlice()
	if dst.Is4() {
		a := dst.As4()
		raw = a[:]
	}
	b := make([]byte, nlmsgHdrLen+rtmsgLen)
	b = appendAttr(b, rtaDst, raw)
	if oif > 0 {
		b = appendAttr(b, rtaOif, binary.NativeEndian.AppendUint32(nil, uint32(oif)))
	}
	putNLHeader(b, rtmGetRoute, nlmFRequest, seq)
	b[nlmsgHdrLen+0] = fam
	b[nlmsgHdrLen+1] = bits
	binary.NativeEndian.PutUint32(b[nlmsgHdrLen+8:], rtmFLookupTable)
	return b
}

// nlDumpRoutesRequest builds the request for every route of one family.
func nlDumpRoutesRequest(seq uint32, family byte) []byte {
	b := make([]byte, nlmsgHdrLen+rtmsgLen)
	putNLHeader(b, rtmGetRoute, nlmFRequest|nlmFDump, seq)
	b[nlmsgHdrLen] = family
	return b
}

func putNLHeader(b []byte, typ, flags uint16, seq uint32) {
	binary.NativeEndian.PutUint32(b[0:4], uint32(len(b)))
	binary.NativeEndian.PutUint16(b[4:6], typ)
	binary.NativeEndian.PutUint16(b[6:8], flags)
	binary.NativeEndian.PutUint32(b[8:12], seq)
	binary.NativeEndian.PutUint32(b[12:16], 0)
}

func appendAttr(b []byte, typ uint16, data []byte) []byte {
	n := rtaHdrLen + len(data)
	b = binary.NativeEndian.AppendUint16(b, uint16(n))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}
