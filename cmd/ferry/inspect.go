package main

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

// inspectCommand is not built yet: it says so and exits 1 rather than pretend.
func inspectCommand() *cli.Command {
	return &cli.Command{
		Name:            "inspect",
		Usage:           "summarise a checkpoint or file (not built yet)",
		SkipFlagParsing: true,
		Action: func(*cli.Context) error {
			return fmt.Errorf("'ferry inspect' is not built yet (issue 2)")
		},
	}
}
