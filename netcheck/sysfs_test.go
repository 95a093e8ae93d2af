package netcheck

import (
	"path/filepath"
	"testing"
)

// TestReadSysfsFixtures reads interface trees captured from real machines
// (testdata/PROVENANCE.md says which parts are captured and which are
// constructed from the documented format).
func TestReadSysfsFixtures(t *testing.T) {
	for _, tc := range []struct {
		tree, iface string
		want        sysfsInfo
	}{
		{"ci-vm", "eth0", sysfsInfo{Kind: "ethernet", MTU: 1400, Operstate: "up"}},
		{"ci-vm", "lo", sysfsInfo{Kind: "loopback", MTU: 65536, Operstate: "unknown"}},
		{"iwl3945", "wlan1", sysfsInfo{WiFi: true, Kind: "wifi", MTU: 1500}},
		{"rpi-usb", "wlan0", sysfsInfo{WiFi: true, Kind: "wifi", MTU: 1500}},
		{"wext", "wlan0", sysfsInfo{WiFi: true, Kind: "wifi", MTU: 1500}},
		{"ci-vm", "missing0", sysfsInfo{Kind: "virtual"}},
	} {
		t.Run(tc.tree+"/"+tc.iface, func(t *testing.T) {
			got := readSysfs(filepath.Join("testdata", "sysfs", tc.tree), tc.iface)
			if got != tc.want {
				t.Errorf("readSysfs = %+v, want %+v", got, tc.want)
			}
		})
	}
}
