package netcheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/ferry-llm/ferry/internal/errkind"
)

// These tests build real networks: network namespaces joined by veth
// pairs, made with iproute2's ip(8), torn down in t.Cleanup. Netcheck runs
// inside the client namespace as a child process of this test binary
// (`ip netns exec NS /proc/self/exe`), so that its netlink socket, its
// probes and /sys/class/net are that namespace's. They need root; without
// it they skip loudly, and fail under CI=true.

// childEnv selects what the test binary does when run as a child.
const childEnv = "FERRY_NETCHECK_CHILD"

func TestMain(m *testing.M) {
	if action := os.Getenv(childEnv); action != "" {
		os.Exit(runChild(action))
	}
	os.Exit(m.Run())
}

// childResult is what a child prints on stdout as JSON.
type childResult struct {
	Report  *Report          `json:"report,omitempty"`
	ErrKind string           `json:"err_kind,omitempty"`
	Err     string           `json:"err,omitempty"`
	Text    string           `json:"text,omitempty"`
	Source  string           `json:"source,omitempty"`
	TxDelta map[string]int64 `json:"tx_delta,omitempty"`
}

func runChild(action string) int {
	var res childResult
	ctx := context.Background()
	setErr := func(err error) {
		if err != nil {
			res.Err, res.ErrKind = err.Error(), errkind.Of(err).String()
		}
	}
	switch action {
	case "check":
		var opts Options
		if err := json.Unmarshal([]byte(os.Getenv("NETCHECK_OPTS")), &opts); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		var targets []Target
		for _, h := range strings.Fields(os.Getenv("NETCHECK_HOSTS")) {
			targets = append(targets, Target{Name: h})
		}
		rep, err := Check(ctx, targets, opts)
		if err != nil {
			setErr(err)
			break
		}
		res.Report = rep
		setErr(rep.Err())
		var b bytes.Buffer
		if err := WriteText(&b, rep); err != nil {
			setErr(err)
		}
		res.Text = b.String()
	case "send":
		// Send NETCHECK_BYTES of UDP to NETCHECK_HOSTS through
		// NETCHECK_VIA the way asked (NETCHECK_BIND: "device" is Via's
		// Dialer; "source" binds the source address only), and report
		// how much left by each interface.
		addr := netip.MustParseAddr(os.Getenv("NETCHECK_HOSTS"))
		n, _ := strconv.Atoi(os.Getenv("NETCHECK_BYTES"))
		b, err := Via(ctx, addr, os.Getenv("NETCHECK_VIA"))
		if err != nil {
			setErr(err)
			break
		}
		res.Source = b.Source.String()
		d := &net.Dialer{LocalAddr: net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.Source, 0))}
		switch os.Getenv("NETCHECK_BIND") {
		case "device":
			d.Control = b.Control
		case "interface": // BindInterface: no source address, the kernel picks it
			bi, err := BindInterface(os.Getenv("NETCHECK_VIA"))
			if err != nil {
				setErr(err)
				break
			}
			d = &net.Dialer{Control: bi.Control}
		}
		before := txBytes()
		c, err := d.Dial("udp", netip.AddrPortFrom(addr, probePort).String())
		if err != nil {
			setErr(err)
			break
		}
		buf := make([]byte, 1000)
		for sent := 0; sent < n && res.Err == ""; sent += len(buf) {
			// A write after the host's port-unreachable returns that
			// error and sends nothing: write the datagram again.
			for try := 0; ; try++ {
				_, err := c.Write(buf)
				if err == nil {
					break
				}
				if !errors.Is(err, syscall.ECONNREFUSED) || try == 3 {
					setErr(err)
					break
				}
			}
		}
		c.Close()
		after := txBytes()
		res.TxDelta = map[string]int64{}
		for k, v := range after {
			res.TxDelta[k] = v - before[k]
		}
	default:
		fmt.Fprintf(os.Stderr, "unknown child action %q\n", action)
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		return 1
	}
	return 0
}

// txBytes reads every interface's transmitted-bytes counter.
func txBytes() map[string]int64 {
	out := map[string]int64{}
	ents, _ := os.ReadDir("/sys/class/net")
	for _, e := range ents {
		b, err := os.ReadFile("/sys/class/net/" + e.Name() + "/statistics/tx_bytes")
		if err != nil {
			continue
		}
		v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		out[e.Name()] = v
	}
	return out
}

// needNetns skips (fails under CI=true) when this process cannot make
// network namespaces.
func needNetns(t *testing.T) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "not root"
	} else if _, err := exec.LookPath("ip"); err != nil {
		why = "ip(8) from iproute2 not found (Debian: apt-get install iproute2)"
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("netns tests cannot run: %s (CI must run them)", why)
	}
	t.Skipf("SKIPPING: network-namespace test needs root and iproute2: %s", why)
}

var nsCount atomic.Int32

// netns makes a network namespace with loopback up, removed at cleanup.
func netns(t *testing.T, role string) string {
	t.Helper()
	name := fmt.Sprintf("fnc%d-%d-%s", os.Getpid(), nsCount.Add(1), role)
	ip(t, "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	ip(t, "-n", name, "link", "set", "lo", "up")
	return name
}

func ip(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// veth joins ns1's a (address addr1, MTU mtu1) to ns2's b.
func veth(t *testing.T, ns1, a, addr1 string, mtu1 int, ns2, b, addr2 string, mtu2 int) {
	t.Helper()
	ip(t, "link", "add", a, "netns", ns1, "mtu", strconv.Itoa(mtu1), "type", "veth", "peer", "name", b, "netns", ns2, "mtu", strconv.Itoa(mtu2))
	ip(t, "-n", ns1, "addr", "add", addr1, "dev", a)
	ip(t, "-n", ns2, "addr", "add", addr2, "dev", b)
	ip(t, "-n", ns1, "link", "set", a, "up")
	ip(t, "-n", ns2, "link", "set", b, "up")
}

// inNS runs a child action in namespace ns.
func inNS(t *testing.T, ns, action string, env ...string) childResult {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", ns, exe)
	cmd.Env = append(os.Environ(), append([]string{childEnv + "=" + action}, env...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child %s in %s: %v\n%s", action, ns, err, stderr.Bytes())
	}
	var res childResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("child %s output: %v\n%s", action, err, out)
	}
	return res
}

func checkIn(t *testing.T, ns string, opts Options, hosts ...string) childResult {
	t.Helper()
	o, _ := json.Marshal(opts)
	res := inNS(t, ns, "check", "NETCHECK_OPTS="+string(o), "NETCHECK_HOSTS="+strings.Join(hosts, " "))
	t.Logf("netcheck %s in %s:\n%s", strings.Join(hosts, " "), ns, res.Text)
	return res
}

// twoPaths builds a client namespace with two veths to one host
// namespace: a0 (MTU 1500) with the default route of metric 100, and b0
// (MTU 9000 at both ends) with one of metric 200. The host answers on
// 10.91.9.9 (its loopback), reached through either.
func twoPaths(t *testing.T) (client string) {
	client, host := netns(t, "c"), netns(t, "h")
	veth(t, client, "a0", "10.91.1.1/24", 1500, host, "a1", "10.91.1.2/24", 1500)
	veth(t, client, "b0", "10.91.2.1/24", 9000, host, "b1", "10.91.2.2/24", 9000)
	ip(t, "-n", host, "addr", "add", "10.91.9.9/32", "dev", "lo")
	ip(t, "-n", client, "route", "add", "default", "via", "10.91.1.2", "dev", "a0", "metric", "100")
	ip(t, "-n", client, "route", "add", "default", "via", "10.91.2.2", "dev", "b0", "metric", "200")
	return client
}

func findings(h HostReport, check string) []Finding {
	var out []Finding
	for _, f := range h.Findings {
		if f.Check == check {
			out = append(out, f)
		}
	}
	return out
}

// TestTwoPathsMetrics: two default routes to one host; the lower metric
// wins, the route leaves by a0, and netcheck says b0 (jumbo frames end to
// end) reaches the host too. With --via b0 the route, source and path MTU
// are b0's and nothing is left to say.
func TestTwoPathsMetrics(t *testing.T) {
	needNetns(t)
	client := twoPaths(t)

	res := checkIn(t, client, Options{}, "10.91.9.9")
	if res.Report == nil {
		t.Fatalf("no report: %s", res.Err)
	}
	want := []DefaultRoute{
		{Family: "inet", Iface: "a0", Gateway: "10.91.1.2", Metric: 100, Wins: true},
		{Family: "inet", Iface: "b0", Gateway: "10.91.2.2", Metric: 200},
	}
	if got := res.Report.Defaults; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("default routes = %+v, want %+v", got, want)
	}
	h := res.Report.Hosts[0]
	if rt := h.Route; rt == nil || rt.Iface != "a0" || rt.Gateway != "10.91.1.2" || rt.Source != "10.91.1.1" || rt.MTU != 1500 {
		t.Errorf("route = %+v, want dev a0 via 10.91.1.2 src 10.91.1.1 mtu 1500", h.Route)
	}
	if h.Iface == nil || h.Iface.Kind != "virtual" || h.Iface.WiFi || h.Iface.SpeedMbps != 10000 {
		t.Errorf("interface = %+v, want a0: virtual (veth), not Wi-Fi, 10000 Mbit/s", h.Iface)
	}
	if p := h.PathMTU; p == nil || p.MTU != 1500 || !p.Exact {
		t.Errorf("path MTU = %+v, want exactly 1500", h.PathMTU)
	}
	if r := h.RTT; r == nil || !r.Refused || len(r.Samples) != 3 {
		t.Errorf("tcp rtt = %+v, want 3 refused samples (nothing listens on 22)", h.RTT)
	}
	path := findings(h, "path")
	if len(path) != 1 || path[0].Level != Warn || !strings.Contains(path[0].Message, "leaves by a0") || !strings.Contains(path[0].Message, "--via b0") {
		t.Errorf("path findings = %+v, want one warning that a0 is used while b0 reaches the host too, with --via b0", path)
	}
	if res.ErrKind != "" {
		t.Errorf("verdict = %s (%s), want ok: a warning is no failed requirement", res.ErrKind, res.Err)
	}

	res = checkIn(t, client, Options{Via: "b0", ExpectMTU: 9000}, "10.91.9.9")
	h = res.Report.Hosts[0]
	if rt := h.Route; rt == nil || rt.Iface != "b0" || rt.Source != "10.91.2.1" || rt.MTU != 9000 {
		t.Errorf("--via b0: route = %+v, want dev b0 src 10.91.2.1 mtu 9000", h.Route)
	}
	if p := h.PathMTU; p == nil || p.MTU != 9000 || !p.Exact {
		t.Errorf("--via b0: path MTU = %+v, want exactly 9000", h.PathMTU)
	}
	for _, f := range h.Findings {
		if f.Check != "ssh" {
			t.Errorf("--via b0 --expect-mtu 9000: unexpected finding %+v", f)
		}
	}
	if res.ErrKind != "" {
		t.Errorf("--via b0 --expect-mtu 9000: verdict %s (%s), want ok", res.ErrKind, res.Err)
	}
}

// TestMTUMismatch: a veth with MTU 9000 on the client's end and 1500 on
// the host's. The host drops every frame larger than its MTU, silently:
// the probe finds exactly 1500, netcheck names the mismatch, and
// --expect-mtu 9000 fails (exit 3).
func TestMTUMismatch(t *testing.T) {
	needNetns(t)
	client, host := netns(t, "c"), netns(t, "h")
	veth(t, client, "m0", "10.92.0.1/24", 9000, host, "m1", "10.92.0.2/24", 1500)

	res := checkIn(t, client, Options{}, "10.92.0.2")
	h := res.Report.Hosts[0]
	if p := h.PathMTU; p == nil || p.MTU != 1500 || !p.Exact {
		t.Fatalf("path MTU = %+v, want exactly 1500", h.PathMTU)
	}
	mtu := findings(h, "mtu")
	if len(mtu) != 1 || !strings.Contains(mtu[0].Message, "m0 MTU 9000 but path MTU to 10.92.0.2 is 1500") {
		t.Errorf("mtu findings = %+v, want m0 MTU 9000 but path MTU 1500", mtu)
	}
	if res.ErrKind != "" {
		t.Errorf("verdict %s (%s), want ok without --expect-mtu", res.ErrKind, res.Err)
	}

	res = checkIn(t, client, Options{ExpectMTU: 9000}, "10.92.0.2")
	h = res.Report.Hosts[0]
	exp := findings(h, "expect-mtu")
	if len(exp) != 1 || exp[0].Level != Fail || !strings.Contains(exp[0].Message, "path MTU to 10.92.0.2 is 1500, --expect-mtu 9000") {
		t.Errorf("expect-mtu findings = %+v", exp)
	}
	if res.ErrKind != errkind.VerifyFailed.String() {
		t.Errorf("--expect-mtu 9000: verdict %q (%s), want %q (exit 3)", res.ErrKind, res.Err, errkind.VerifyFailed)
	}
}

// TestNoRoute: a namespace with nothing but loopback has no route to the
// host: one failed finding with the remedy, verdict exit 3. An interface
// that does not exist is a usage error (exit 2).
func TestNoRoute(t *testing.T) {
	needNetns(t)
	lonely := netns(t, "n")
	res := checkIn(t, lonely, Options{}, "10.93.0.1")
	if res.Report == nil {
		t.Fatalf("no report: %s", res.Err)
	}
	h := res.Report.Hosts[0]
	route := findings(h, "route")
	if len(route) != 1 || route[0].Level != Fail || !strings.Contains(route[0].Message, "no route to 10.93.0.1 (RTM_GETROUTE: network is unreachable)") || !strings.Contains(route[0].Message, "ip route add 10.93.0.1/32") {
		t.Errorf("route findings = %+v", route)
	}
	if len(res.Report.Defaults) != 0 {
		t.Errorf("default routes = %+v, want none", res.Report.Defaults)
	}
	if res.ErrKind != errkind.VerifyFailed.String() || res.Report.OK {
		t.Errorf("verdict %q (%s), ok=%v; want %q (exit 3)", res.ErrKind, res.Err, res.Report.OK, errkind.VerifyFailed)
	}

	res = checkIn(t, lonely, Options{Via: "nosuch0"}, "10.93.0.1")
	if res.ErrKind != errkind.Usage.String() || !strings.Contains(res.Err, `"nosuch0"`) {
		t.Errorf("--via nosuch0: error %q (%s), want a usage error naming the interface", res.Err, res.ErrKind)
	}
}

// TestViaBinding: what a Binding from Via (or BindInterface) sends leaves
// by the interface it names, as the client namespace's tx_bytes counters show; binding only
// the source address does not do that (Linux routes by destination), so
// Via's Control is what makes --via work. An interface with no route to
// the host is refused with ErrNoRouteVia.
func TestViaBinding(t *testing.T) {
	needNetns(t)
	client := twoPaths(t)
	host := netns(t, "x")
	veth(t, client, "c0", "10.91.3.1/24", 1500, host, "c1", "10.91.3.2/24", 1500)
	const n = 200_000

	res := inNS(t, client, "send", "NETCHECK_HOSTS=10.91.9.9", "NETCHECK_VIA=b0", "NETCHECK_BYTES="+strconv.Itoa(n), "NETCHECK_BIND=device")
	if res.Err != "" {
		t.Fatalf("send via b0: %s", res.Err)
	}
	if res.Source != "10.91.2.1" {
		t.Errorf("Via(b0) source = %s, want 10.91.2.1", res.Source)
	}
	if b, a := res.TxDelta["b0"], res.TxDelta["a0"]; b < n || a > n/10 {
		t.Errorf("bound to b0: tx bytes b0 +%d, a0 +%d; want b0 ≥ %d and a0 about 0", b, a, n)
	}

	res = inNS(t, client, "send", "NETCHECK_HOSTS=10.91.9.9", "NETCHECK_VIA=b0", "NETCHECK_BYTES="+strconv.Itoa(n), "NETCHECK_BIND=interface")
	if res.Err != "" {
		t.Fatalf("send bound to b0 by name: %s", res.Err)
	}
	if b, a := res.TxDelta["b0"], res.TxDelta["a0"]; b < n || a > n/10 {
		t.Errorf("BindInterface(b0): tx bytes b0 +%d, a0 +%d; want b0 ≥ %d and a0 about 0", b, a, n)
	}

	res = inNS(t, client, "send", "NETCHECK_HOSTS=10.91.9.9", "NETCHECK_VIA=b0", "NETCHECK_BYTES="+strconv.Itoa(n), "NETCHECK_BIND=source")
	if res.Err != "" {
		t.Fatalf("send from b0's address: %s", res.Err)
	}
	if b, a := res.TxDelta["b0"], res.TxDelta["a0"]; a < n || b > n/10 {
		t.Errorf("source address only: tx bytes a0 +%d, b0 +%d; want the kernel's route (a0) to carry it", a, b)
	}

	res = inNS(t, client, "send", "NETCHECK_HOSTS=10.91.9.9", "NETCHECK_VIA=c0", "NETCHECK_BYTES=1")
	if res.ErrKind != errkind.VerifyFailed.String() || !strings.Contains(res.Err, ErrNoRouteVia.Error()) {
		t.Errorf("Via(c0) = %q (%s), want ErrNoRouteVia (c0 has no route to 10.91.9.9)", res.Err, res.ErrKind)
	}
}
