package netcheck

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func darwinFixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "darwin", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseRouteGet(t *testing.T) {
	got, err := parseRouteGet(darwinFixture(t, "route-get-en1.txt"))
	if err != nil {
		t.Fatal(err)
	}
	want := routeGet{Destination: "default", Gateway: "192.168.1.1", Iface: "en1", Flags: []string{"UP", "GATEWAY", "DONE", "STATIC", "PRCLONING"}, MTU: 1500}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseRouteGet = %+v, want %+v", got, want)
	}
	if _, err := parseRouteGet("route: writing to routing socket: not in table\n"); err == nil {
		t.Error("route get without an interface line parsed")
	}
}

func TestParseNetstatDefaults(t *testing.T) {
	for _, tc := range []struct {
		file string
		want []DefaultRoute
	}{
		{"netstat-rn-2018.txt", []DefaultRoute{{Family: "inet", Iface: "en0", Gateway: "10.10.10.1", Wins: true}}},
		{"netstat-rn-11.3.txt", []DefaultRoute{{Family: "inet", Iface: "en0", Gateway: "192.168.0.1", Wins: true}}},
		{"netstat-rn-scoped-CONSTRUCTED.txt", []DefaultRoute{
			{Family: "inet", Iface: "en0", Gateway: "192.168.1.1", Wins: true},
			{Family: "inet", Iface: "en8", Gateway: "10.0.0.1", Metric: 1, Scoped: true},
		}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			got, err := parseNetstatDefaults(darwinFixture(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("defaults = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParseHardwarePorts(t *testing.T) {
	got, err := parseHardwarePorts(darwinFixture(t, "networksetup-listallhardwareports.txt"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"HUAWEIMobile-Modem": "HUAWEIMobile-",
		"Bluetooth-Modem":    "Bluetooth DUN",
		"en0":                "Ethernet",
		"en5":                "MBBEthernet",
		"en1":                "Wi-Fi",
		"en4":                "Bluetooth PAN",
		"en2":                "Thunderbolt 1",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ports = %v, want %v", got, want)
	}
	for dev, kind := range map[string]string{"en1": "wifi", "en0": "ethernet", "en2": "thunderbolt"} {
		if k := darwinKind(dev, got[dev], ifconfigInfo{}); k != kind {
			t.Errorf("darwinKind(%s, %q) = %s, want %s", dev, got[dev], k, kind)
		}
	}
}

func TestParseIfconfig(t *testing.T) {
	all, err := parseIfconfig(darwinFixture(t, "ifconfig-a.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 17 {
		t.Errorf("%d interfaces, want 17", len(all))
	}
	for _, tc := range []struct {
		name       string
		mtu, speed int
		active, up bool
		kind       string
	}{
		{"lo0", 16384, 0, false, true, "loopback"},
		{"en8", 1500, 100, true, true, "virtual"}, // no hardware port given: ifconfig alone does not say Ethernet
		{"en0", 1500, 0, false, true, "virtual"},
		{"bridge0", 1500, 0, false, true, "bridge"},
		{"awdl0", 1484, 0, false, false, "virtual"},
	} {
		ic, ok := all[tc.name]
		if !ok {
			t.Errorf("%s missing", tc.name)
			continue
		}
		up := false
		for _, f := range ic.Flags {
			up = up || f == "UP"
		}
		if ic.MTU != tc.mtu || ic.SpeedMbps != tc.speed || ic.Active != tc.active || up != tc.up {
			t.Errorf("%s = %+v, want mtu %d speed %d active %v up %v", tc.name, ic, tc.mtu, tc.speed, tc.active, tc.up)
		}
		if k := darwinKind(tc.name, "", ic); k != tc.kind {
			t.Errorf("darwinKind(%s) = %s, want %s", tc.name, k, tc.kind)
		}
	}

	v, err := parseIfconfig(darwinFixture(t, "ifconfig-v-en2.txt"))
	if err != nil {
		t.Fatal(err)
	}
	en2 := v["en2"]
	if en2.Type != "IP over Thunderbolt" || en2.MTU != 1500 || en2.Active || darwinKind("en2", "", en2) != "thunderbolt" {
		t.Errorf("ifconfig -v en2 = %+v (kind %s), want type IP over Thunderbolt, mtu 1500, inactive, thunderbolt", en2, darwinKind("en2", "", en2))
	}
}

func TestMediaSpeed(t *testing.T) {
	for media, want := range map[string]int{
		"autoselect (100baseTX <full-duplex>)":              100,
		"autoselect (1000baseT <full-duplex,flow-control>)": 1000,
		"autoselect (10Gbase-T <full-duplex>)":              10000,
		"autoselect (2500Base-T <full-duplex>)":             2500,
		"autoselect":                                        0,
		"autoselect (<unknown type>)":                       0,
		"autoselect (none)":                                 0,
	} {
		if got := mediaSpeed(media); got != want {
			t.Errorf("mediaSpeed(%q) = %d, want %d", media, got, want)
		}
	}
}
