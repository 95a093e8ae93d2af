package netcheck

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// sysfsInfo is what /sys/class/net/IF tells about an interface.
type sysfsInfo struct {
	WiFi      bool
	Kind      string
	MTU       int
	SpeedMbps int // 0: unknown
	Operstate string
}

// ARPHRD_LOOPBACK, include/uapi/linux/if_arp.h.
const arphrdLoopback = 772

// readSysfs reads interface name under root (/sys/class/net on a live
// system; a captured tree in tests). Wi-Fi is an interface with a
// "wireless" directory (wireless extensions) or a "phy80211" link
// (cfg80211): both exist only for 802.11 devices. speed is Mbit/s from
// ethtool's link settings; the kernel fails the read (EINVAL) when the
// device is down or has no ethtool speed, and prints -1 for unknown
// (net/core/net-sysfs.c, speed_show): both are "unknown" here. A device
// link means hardware; none means a virtual interface (veth, tun, VPN).
func readSysfs(root, name string) sysfsInfo {
	dir := filepath.Join(root, name)
	exists := func(p string) bool { _, err := os.Lstat(filepath.Join(dir, p)); return err == nil }
	readInt := func(p string) (int, bool) {
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			return 0, false
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		return n, err == nil
	}
	var s sysfsInfo
	s.MTU, _ = readInt("mtu")
	if v, ok := readInt("speed"); ok && v > 0 {
		s.SpeedMbps = v
	}
	if b, err := os.ReadFile(filepath.Join(dir, "operstate")); err == nil {
		s.Operstate = strings.TrimSpace(string(b))
	}
	s.WiFi = exists("wireless") || exists("phy80211")
	typ, _ := readInt("type")
	switch {
	case typ == arphrdLoopback:
		s.Kind = "loopback"
	case s.WiFi:
		s.Kind = "wifi"
	case exists("bridge"):
		s.Kind = "bridge"
	case exists("device"):
		s.Kind = "ethernet"
	default:
		s.Kind = "virtual"
	}
	return s
}
