package main

import (
	"context"
	"log/slog"

	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/netcheck"
	"github.com/ferry-llm/ferry/transfer"
	"github.com/ferry-llm/ferry/transfer/sshconn"
)

// bindVia pins every SSH connection of the transfer to --via's interface
// (the source address alone would not: Linux routes by destination).
func bindVia(c *cli.Context, o *sshconn.Options) error {
	via := c.String("via")
	if via == "" {
		return nil
	}
	b, err := netcheck.BindInterface(via)
	if err != nil {
		return err
	}
	o.Control = b.Control
	return nil
}

// netcheckPreFlight binds the transfer's connections to --via's
// interface, and returns ferry netcheck to run before a byte goes to each
// destination, with --via, --expect-mtu and --require-wired as its
// requirements; --skip-netcheck turns the check (not the binding) off.
func netcheckPreFlight(c *cli.Context, o *sshconn.Options) (func(ctx context.Context, d transfer.Destination) error, error) {
	if err := bindVia(c, o); err != nil {
		return nil, err
	}
	if c.Bool("skip-netcheck") {
		return nil, nil
	}
	if m := c.Int("expect-mtu"); c.IsSet("expect-mtu") && m < 68 {
		return nil, usageErrorf("--expect-mtu %d: an MTU is at least 68", m)
	}
	d, err := sshconn.NewDialer(*o)
	if err != nil {
		return nil, err
	}
	opts := netcheck.Options{Via: c.String("via"), ExpectMTU: c.Int("expect-mtu"), RequireWired: c.Bool("require-wired")}
	check := netcheck.PreFlight(d, opts, slog.Default(), nil)
	return func(ctx context.Context, d transfer.Destination) error { return check(ctx, d.Host) }, nil
}
