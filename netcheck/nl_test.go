package netcheck

import (
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// kernelReply reads a seed of FuzzNetlink: a datagram the Linux kernel
// sent in answer to netcheck's requests (captured on this repository's
// test machine, in its root namespace and in namespaces with multipath,
// mtu-locked and no routes).
func kernelReply(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "fuzz", "FuzzNetlink", name))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	lit := strings.TrimSuffix(strings.TrimPrefix(lines[len(lines)-1], "[]byte("), ")")
	s, err := strconv.Unquote(lit)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return []byte(s)
}

func routesOf(t *testing.T, b []byte) []nlRoute {
	t.Helper()
	msgs, err := parseNLMessages(b)
	if err != nil {
		t.Fatal(err)
	}
	var rs []nlRoute
	for _, m := range msgs {
		if m.Type != rtmNewRoute {
			continue
		}
		r, err := parseNLRoute(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	return rs
}

func TestParseKernelReplies(t *testing.T) {
	// ip route add 10.96.0.0/16 via 10.94.0.2 dev s0 mtu lock 1400; ip route get 10.96.1.1
	rs := routesOf(t, kernelReply(t, "netns-mtu-get-dst-0"))
	if len(rs) != 1 || rs[0].MTU != 1400 || rs[0].Gateway != netip.MustParseAddr("10.94.0.2") || rs[0].PrefSrc != netip.MustParseAddr("10.94.0.1") || rs[0].Table != rtTableMain {
		t.Errorf("route get with mtu lock 1400 = %+v", rs)
	}
	// ip route get 127.0.0.1: a local route on lo (reported in the main
	// table: without policy rules the kernel merges local into main)
	rs = routesOf(t, kernelReply(t, "host-get-local-0"))
	if len(rs) != 1 || rs[0].Type != rtnLocal || rs[0].Oif != 1 || rs[0].PrefSrc != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("route get 127.0.0.1 = %+v", rs)
	}
	// a dump with a multipath route (two nexthops) and a default of metric 300
	var multi, def *nlRoute
	rs = routesOf(t, kernelReply(t, "netns-dump-inet-0"))
	for i := range rs {
		switch {
		case rs[i].Dst == netip.MustParseAddr("10.95.0.0"):
			multi = &rs[i]
		case rs[i].DstLen == 0 && rs[i].Table == rtTableMain:
			def = &rs[i]
		}
	}
	if multi == nil || len(multi.Nexthops) != 2 || multi.Nexthops[0].Gateway != netip.MustParseAddr("10.94.0.2") || multi.Nexthops[1].Gateway != netip.MustParseAddr("10.94.0.3") {
		t.Errorf("multipath route = %+v", multi)
	}
	if def == nil || !def.HasPrio || def.Priority != 300 || def.Gateway != netip.MustParseAddr("10.94.0.2") {
		t.Errorf("default route = %+v", def)
	}
	// no route: NLMSG_ERROR with -ENETUNREACH
	msgs, err := parseNLMessages(kernelReply(t, "noroute-get-dst-0"))
	if err != nil || len(msgs) != 1 || msgs[0].Type != nlmsgError {
		t.Fatalf("no-route reply = %+v, %v", msgs, err)
	}
	if e, err := nlErrno(msgs[0].Data); err != nil || syscall.Errno(-e) != syscall.ENETUNREACH {
		t.Errorf("no-route errno = %d, %v; want -ENETUNREACH", e, err)
	}
}

func TestParseNLRejectsTruncated(t *testing.T) {
	good := kernelReply(t, "host-get-dst-0")
	for n := 1; n < len(good); n++ {
		if msgs, err := parseNLMessages(good[:n]); err == nil {
			t.Fatalf("%d of %d bytes parsed as %d messages without an error", n, len(good), len(msgs))
		}
	}
	// A route whose attribute claims more bytes than the message holds.
	msgs, err := parseNLMessages(good)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("reply: %v", err)
	}
	data := append([]byte(nil), msgs[0].Data...)
	data[rtmsgLen] = 0xff // first attribute's length, low byte
	if _, err := parseNLRoute(data); err == nil {
		t.Error("an attribute longer than the message parsed")
	}
}

// FuzzNetlink: whatever the socket returns, the parsers return an error
// or values that lie inside the input, and never panic or allocate
// beyond their bounds. Seeds are real kernel replies.
func FuzzNetlink(f *testing.F) {
	f.Add(nlGetRouteRequest(1, netip.MustParseAddr("10.0.0.1"), 3))
	f.Add(nlDumpRoutesRequest(2, afInet6))
	f.Fuzz(func(t *testing.T, b []byte) {
		msgs, err := parseNLMessages(b)
		if err != nil {
			return
		}
		total := 0
		for _, m := range msgs {
			total += nlmsgHdrLen + len(m.Data)
			switch m.Type {
			case rtmNewRoute:
				r, err := parseNLRoute(m.Data)
				if err == nil && len(r.Nexthops) > maxNexthops {
					t.Fatalf("%d nexthops", len(r.Nexthops))
				}
			case nlmsgError:
				_, _ = nlErrno(m.Data)
			}
		}
		if total > len(b) {
			t.Fatalf("messages hold %d bytes of a %d-byte datagram", total, len(b))
		}
	})
}
