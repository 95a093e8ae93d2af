package netcheck

import (
	"fmt"
	"io"
	"strings"
)

// WriteText prints the report for a person: per host its route,
// interface, default routes, path MTU, TCP round trip, then its findings
// one a line ("FAIL: …", "warn: …"), and a last line with the verdict.
func WriteText(w io.Writer, r *Report) error {
	var b strings.Builder
	for i, h := range r.Hosts {
		if i > 0 {
			b.WriteByte('\n')
		}
		title := h.Name
		if h.Addr != "" && h.Addr != h.Name {
			title += " (" + h.Addr + ")"
		}
		if h.Port != sshPort {
			title += fmt.Sprintf(" port %d", h.Port)
		}
		b.WriteString(title + "\n")
		if h.Error != "" {
			fmt.Fprintf(&b, "  FAIL: %s\n", h.Error)
			continue
		}
		if rt := h.Route; rt != nil {
			fmt.Fprintf(&b, "  route      %s\n", routeLine(*rt))
		}
		if ifc := h.Iface; ifc != nil {
			fmt.Fprintf(&b, "  interface  %s\n", ifaceLine(*ifc))
		}
		if pm := h.PathMTU; pm != nil {
			fmt.Fprintf(&b, "  path MTU   %s\n", pmtuLine(*pm))
		}
		if t := h.RTT; t != nil {
			fmt.Fprintf(&b, "  tcp/%-6d %s\n", t.Port, rttLine(*t))
		}
		for _, f := range h.Findings {
			fmt.Fprintf(&b, "  %s: %s\n", levelWord(f.Level), f.Message)
		}
	}
	b.WriteString("\ndefault routes")
	if len(r.Defaults) == 0 {
		b.WriteString(": none\n")
	} else {
		b.WriteByte('\n')
		for _, d := range r.Defaults {
			fmt.Fprintf(&b, "  %s\n", defaultLine(d))
		}
	}
	if r.OK {
		b.WriteString("\nok: every check passed\n")
	} else {
		b.WriteString("\nnot ok: see FAIL above\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func levelWord(l string) string {
	if l == Fail {
		return "FAIL"
	}
	return l
}

func routeLine(rt Route) string {
	s := "dev " + rt.Iface
	if rt.Local {
		s += " (this machine's own address)"
	}
	if rt.Gateway != "" {
		s += " via " + rt.Gateway
	}
	if rt.Source != "" {
		s += " src " + rt.Source
	}
	if rt.MTU > 0 {
		s += fmt.Sprintf(" mtu %d", rt.MTU)
	}
	return s
}

func ifaceLine(i Interface) string {
	s := fmt.Sprintf("%s: %s, MTU %d", i.Name, i.Kind, i.MTU)
	if i.SpeedMbps > 0 {
		s += fmt.Sprintf(", %d Mbit/s", i.SpeedMbps)
	} else {
		s += ", speed unknown"
	}
	if i.Up {
		s += ", up"
	} else {
		s += ", down"
	}
	return s
}

func pmtuLine(p PathMTU) string {
	var s string
	switch {
	case p.MTU == 0:
		s = "not measured"
	case p.Exact:
		s = fmt.Sprintf("%d", p.MTU)
	default:
		s = fmt.Sprintf("at least %d, less than %d", p.MTU, p.Below)
	}
	s += fmt.Sprintf(" (%d probes", p.Probes)
	if p.Note != "" {
		s += "; " + p.Note
	}
	return s + ")"
}

func rttLine(t RTT) string {
	var s string
	if len(t.Samples) > 0 {
		s = fmt.Sprintf("%.3f ms (min of %d; median %.3f ms)", t.MinMS, len(t.Samples), t.MedMS)
	}
	switch {
	case t.Refused:
		s += ", refused"
	case t.Error != "":
		if s != "" {
			s += ", then "
		}
		s += t.Error
	}
	return s
}

func defaultLine(d DefaultRoute) string {
	s := fmt.Sprintf("%-5s dev %s", d.Family, d.Iface)
	if d.Gateway != "" {
		s += " via " + d.Gateway
	}
	if d.Scoped {
		s += " (interface-scoped)"
	} else {
		s += fmt.Sprintf(" metric %d", d.Metric)
	}
	if d.Wins {
		s += "  ← wins"
	}
	return s
}
