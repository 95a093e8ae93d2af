package main

import (
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/netcheck"
)

func netcheckCommand() *cli.Command {
	return &cli.Command{
		Name:      "netcheck",
		Usage:     "check the route, interface, MTU and Wi-Fi to each host before a transfer",
		ArgsUsage: "HOST...",
		Description: "For each HOST (as 'ferry transfer' takes it): the resolved address; the route the kernel would use\n" +
			"(egress interface, source, gateway, route MTU); whether that interface is Wi-Fi, its MTU and link speed;\n" +
			"the path MTU to the host (DF-set UDP probes to a closed port; no root needed) and the TCP round trip to\n" +
			"its SSH port; every default route and which wins. Each problem is one line with what to do.\n\n" +
			"Exit 0 when every requirement holds, 3 when one fails (no route, --via, --expect-mtu, --require-wired),\n" +
			"2 on a usage error or an unknown host.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "via", Usage: "the interface transfers must leave by: fail when no route to a host goes through it"},
			&cli.IntFlag{Name: "expect-mtu", Usage: "fail unless the egress interface MTU and the path MTU are this"},
			&cli.BoolFlag{Name: "require-wired", Usage: "fail when a host's route leaves by Wi-Fi"},
			&cli.IntFlag{Name: "port", Value: 22, Usage: "SSH port to time"},
			jsonFlag("print the report as JSON"),
		},
		Action: runNetcheck,
	}
}

func runNetcheck(c *cli.Context) error {
	if c.NArg() == 0 {
		return usageErrorf("'ferry netcheck' needs at least one HOST")
	}
	if c.Int("expect-mtu") < 0 || (c.IsSet("expect-mtu") && c.Int("expect-mtu") < 68) {
		return usageErrorf("--expect-mtu %d: an MTU is at least 68", c.Int("expect-mtu"))
	}
	if p := c.Int("port"); p < 1 || p > 65535 {
		return usageErrorf("--port %d: not a TCP port", p)
	}
	var targets []netcheck.Target
	for _, a := range c.Args().Slice() {
		t, err := netcheckTarget(a, c.Int("port"))
		if err != nil {
			return err
		}
		targets = append(targets, t)
	}
	opts := netcheck.Options{Via: c.String("via"), ExpectMTU: c.Int("expect-mtu"), RequireWired: c.Bool("require-wired")}
	rep, err := netcheck.Check(c.Context, targets, opts)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		err = printJSON(c, rep)
	} else {
		err = netcheck.WriteText(stdout(c), rep)
	}
	if err != nil {
		return err
	}
	return rep.Err()
}

// netcheckTarget reads HOST as 'ferry transfer' names a host: [user@]host
// with an optional :DIR, which netcheck does not need.
func netcheckTarget(arg string, port int) (netcheck.Target, error) {
	host := arg
	if i := strings.LastIndexByte(host, '@'); i >= 0 {
		host = host[i+1:]
	}
	if strings.HasPrefix(host, "[") {
		if j := strings.IndexByte(host, ']'); j > 0 {
			host = host[1:j]
		}
	} else if i := strings.IndexByte(host, ':'); i >= 0 && strings.Count(host, ":") == 1 {
		host = host[:i]
	}
	if host == "" {
		return netcheck.Target{}, usageErrorf("netcheck: %q names no host", arg)
	}
	return netcheck.Target{Name: host, Host: host, Port: port}, nil
}
