package main

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

// verifyCommand is not built yet: it says so and exits 1 rather than pretend.
func verifyCommand() *cli.Command {
	return &cli.Command{
		Name:            "verify",
		Usage:           "verify that artifacts are fit to serve (MTP heads, …) (not built yet)",
		SkipFlagParsing: true,
		Action: func(*cli.Context) error {
			return fmt.Errorf("'ferry verify' is not built yet (issue 6)")
		},
	}
}
