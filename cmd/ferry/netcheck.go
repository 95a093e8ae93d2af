package main

import (
	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/netcheck"
	"github.com/ferry-llm/ferry/transfer/sshconn"
)

func netcheckCommand() *cli.Command {
	return &cli.Command{
		Name:      "netcheck",
		Usage:     "check the route, interface, MTU and Wi-Fi to each host before a transfer",
		ArgsUsage: "HOST...",
		Description: "For each HOST ([user@]host[:port], or a transfer destination host:DIR; ssh_config aliases are\n" +
			"resolved as 'ferry transfer' resolves them, and with ProxyJump the first jump host is checked):\n" +
			"the resolved address; the route the kernel would use (egress interface, source, gateway, route MTU);\n" +
			"whether that interface is Wi-Fi, its MTU and link speed;\n" +
			"the path MTU to the host (DF-set UDP probes to a closed port; no root needed) and the TCP round trip to\n" +
			"its SSH port; every default route and which wins. Each problem is one line with what to do.\n\n" +
			"Exit 0 when every requirement holds, 3 when one fails (no route, --via, --expect-mtu, --require-wired),\n" +
			"2 on a usage error or an unknown host.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "via", Usage: "the interface transfers must leave by: fail when no route to a host goes through it"},
			&cli.IntFlag{Name: "expect-mtu", Usage: "fail unless the egress interface MTU and the path MTU are this"},
			&cli.BoolFlag{Name: "require-wired", Usage: "fail when a host's route leaves by Wi-Fi"},
			&cli.StringFlag{Name: "ssh-config", Usage: "the ssh_config file that resolves host aliases (default ~/.ssh/config, then /etc/ssh/ssh_config; none: no file)"},
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
	targets, err := netcheckTargets(c.Args().Slice(), c.String("ssh-config"))
	if err != nil {
		return err
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

// netcheckTargets resolves HOST arguments as 'ferry transfer' names
// hosts: [user@]host[:port], or a transfer destination [user@]host[:port]:DIR,
// with ssh_config aliases resolved (HostName, Port; ProxyJump's first
// hop) by sshconn.
func netcheckTargets(args []string, sshConfig string) ([]netcheck.Target, error) {
	d, err := sshconn.NewDialer(sshconn.Options{SSHConfigPath: sshConfig})
	if err != nil {
		return nil, err
	}
	var out []netcheck.Target
	for _, a := range args {
		t, err := sshconn.ParseHost(a)
		if err != nil && sshconn.LooksRemote(a) {
			t, err = sshconn.ParseTarget(a)
		}
		if err != nil {
			return nil, err
		}
		e, err := d.Resolve(t)
		if err != nil {
			return nil, err
		}
		out = append(out, netcheck.SSHTarget(e))
	}
	return out, nil
}
