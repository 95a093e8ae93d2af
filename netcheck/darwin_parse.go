package netcheck

import (
	"bufio"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Parsers for the macOS commands netcheck runs. They are plain Go so that
// they build and are tested everywhere, on outputs captured from real
// Macs (testdata/darwin, PROVENANCE.md there). Output larger than
// maxCommandOutput is refused before parsing.

const maxCommandOutput = 4 << 20

// routeGet is what `route -n get HOST` prints.
type routeGet struct {
	Destination string
	Gateway     string
	Iface       string
	Flags       []string
	MTU         int
}

// parseRouteGet reads `route -n get`: "key: value" lines, then a table
// of metrics whose header names the columns (recvpipe … mtu expire).
func parseRouteGet(out string) (routeGet, error) {
	var r routeGet
	if len(out) > maxCommandOutput {
		return r, fmt.Errorf("route get: %d bytes of output", len(out))
	}
	lines := strings.Split(out, "\n")
	for i, line := range lines {
		if k, v, ok := strings.Cut(line, ":"); ok {
			val := strings.TrimSpace(v)
			switch strings.TrimSpace(k) {
			case "destination":
				r.Destination = val
			case "gateway":
				r.Gateway = val
			case "interface":
				r.Iface = val
			case "flags":
				r.Flags = strings.Split(strings.Trim(val, "<>"), ",")
			}
			continue
		}
		cols := strings.Fields(line)
		if j := slices.Index(cols, "mtu"); j >= 0 && i+1 < len(lines) {
			if vals := strings.Fields(lines[i+1]); j < len(vals) {
				r.MTU, _ = strconv.Atoi(vals[j])
			}
		}
	}
	if r.Iface == "" {
		return r, fmt.Errorf("route get: no interface in the output")
	}
	return r, nil
}

// parseNetstatDefaults reads `netstat -rn` (any layout: the columns are
// found by the header's names) and returns the default routes of each
// section, in the order listed. A route flagged I (RTF_IFSCOPE) is scoped
// to its interface; the first unscoped default of a family is the one
// that wins (macOS ranks defaults by service order, and the unscoped one
// is the primary service's).
func parseNetstatDefaults(out string) ([]DefaultRoute, error) {
	if len(out) > maxCommandOutput {
		return nil, fmt.Errorf("netstat: %d bytes of output", len(out))
	}
	var ds []DefaultRoute
	fam := ""
	var dst, gw, flags, netif = -1, -1, -1, -1
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() {
		line := sc.Text()
		switch strings.TrimSpace(line) {
		case "Internet:":
			fam, dst = "inet", -1
			continue
		case "Internet6:":
			fam, dst = "inet6", -1
			continue
		}
		f := strings.Fields(line)
		if len(f) == 0 || fam == "" {
			continue
		}
		if f[0] == "Destination" {
			dst, gw, flags, netif = 0, slices.Index(f, "Gateway"), slices.Index(f, "Flags"), slices.Index(f, "Netif")
			continue
		}
		if dst < 0 || gw < 0 || flags < 0 || netif < 0 || f[dst] != "default" {
			continue
		}
		// Rows leave trailing columns (Expire) empty; the Netif column
		// may be the last field.
		if len(f) <= max(gw, flags) {
			continue
		}
		ifc := ""
		if netif < len(f) {
			ifc = f[netif]
		} else {
			ifc = f[len(f)-1]
		}
		d := DefaultRoute{Family: fam, Iface: ifc, Scoped: strings.Contains(f[flags], "I")}
		if !strings.HasPrefix(f[gw], "link#") {
			d.Gateway = f[gw]
		}
		ds = append(ds, d)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("netstat: %w", err)
	}
	won := map[string]bool{}
	n := map[string]int{}
	for i := range ds {
		ds[i].Metric = n[ds[i].Family]
		n[ds[i].Family]++
		if !ds[i].Scoped && !won[ds[i].Family] {
			ds[i].Wins, won[ds[i].Family] = true, true
		}
	}
	return ds, nil
}

// parseHardwarePorts reads `networksetup -listallhardwareports`: blocks
// of "Hardware Port: NAME" / "Device: DEV". It maps device to port name.
func parseHardwarePorts(out string) (map[string]string, error) {
	if len(out) > maxCommandOutput {
		return nil, fmt.Errorf("networksetup: %d bytes of output", len(out))
	}
	ports := map[string]string{}
	port := ""
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "Hardware Port":
			port = strings.TrimSpace(v)
		case "Device":
			if port != "" {
				ports[strings.TrimSpace(v)] = port
				port = ""
			}
		}
	}
	return ports, nil
}

// ifconfigInfo is what `ifconfig [-v] IF` says about one interface.
type ifconfigInfo struct {
	Name      string
	Flags     []string
	MTU       int
	Active    bool   // status: active
	Media     string // the media line's value
	SpeedMbps int    // from the media subtype (100baseTX, 10Gbase-T…); 0 unknown
	Type      string // ifconfig -v "type:" (Wi-Fi, Ethernet, IP over Thunderbolt…)
}

// parseIfconfig reads `ifconfig` or `ifconfig -v IF` output: a line
// "NAME: flags=HEX<FLAG,…> mtu N" opens each interface, indented lines
// describe it.
func parseIfconfig(out string) (map[string]ifconfigInfo, error) {
	if len(out) > maxCommandOutput {
		return nil, fmt.Errorf("ifconfig: %d bytes of output", len(out))
	}
	res := map[string]ifconfigInfo{}
	var cur *ifconfigInfo
	flush := func() {
		if cur != nil {
			res[cur.Name] = *cur
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if line == "" {
			continue
		}
		if line[0] != ' ' && line[0] != '\t' {
			name, rest, ok := strings.Cut(line, ": flags=")
			if !ok {
				continue
			}
			flush()
			cur = &ifconfigInfo{Name: name}
			if i, j := strings.IndexByte(rest, '<'), strings.IndexByte(rest, '>'); i >= 0 && j > i {
				if fl := rest[i+1 : j]; fl != "" {
					cur.Flags = strings.Split(fl, ",")
				}
			}
			f := strings.Fields(rest)
			if k := slices.Index(f, "mtu"); k >= 0 && k+1 < len(f) {
				cur.MTU, _ = strconv.Atoi(f[k+1])
			}
			continue
		}
		if cur == nil {
			continue
		}
		k, v, ok := strings.Cut(strings.TrimSpace(line), ": ")
		if !ok {
			continue
		}
		switch k {
		case "status":
			cur.Active = v == "active"
		case "media":
			cur.Media = v
			cur.SpeedMbps = mediaSpeed(v)
		case "type":
			cur.Type = v
		}
	}
	flush()
	return res, nil
}

// mediaSpeed reads the speed of the active media subtype ifconfig shows
// in parentheses ("autoselect (1000baseT <full-duplex>)", "10Gbase-T",
// "2500Base-T"): the number before "base", times 1000 after a G.
func mediaSpeed(media string) int {
	i, j := strings.IndexByte(media, '('), strings.IndexByte(media, ')')
	if i < 0 || j < i {
		return 0
	}
	sub := strings.Fields(media[i+1 : j])
	if len(sub) == 0 {
		return 0
	}
	lower := strings.ToLower(sub[0])
	k := strings.Index(lower, "base")
	if k <= 0 {
		return 0
	}
	num, mult := lower[:k], 1
	if strings.HasSuffix(num, "g") {
		num, mult = num[:len(num)-1], 1000
	}
	n, err := strconv.Atoi(num)
	if err != nil || n <= 0 || n > 1_000_000 {
		return 0
	}
	return n * mult
}

// darwinKind classifies a macOS interface from its hardware port name
// (networksetup), ifconfig -v's type and its flags.
func darwinKind(name, port string, ic ifconfigInfo) string {
	p := strings.ToLower(port + " " + ic.Type)
	switch {
	case slices.Index(ic.Flags, "LOOPBACK") >= 0:
		return "loopback"
	case strings.Contains(p, "wi-fi") || strings.Contains(p, "airport"):
		return "wifi"
	case strings.Contains(p, "thunderbolt") && !strings.HasPrefix(name, "bridge"):
		return "thunderbolt"
	case strings.HasPrefix(name, "bridge"):
		return "bridge"
	case strings.Contains(p, "ethernet") || strings.Contains(p, "lan"):
		return "ethernet"
	}
	return "virtual"
}
