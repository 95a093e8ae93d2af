package main

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

// mergeCommand is not built yet: it says so and exits 1 rather than pretend.
func mergeCommand() *cli.Command {
	return &cli.Command{
		Name:            "merge",
		Usage:           "merge a LoRA/DoRA adapter into a base checkpoint (not built yet)",
		SkipFlagParsing: true,
		Action: func(*cli.Context) error {
			return fmt.Errorf("'ferry merge' is not built yet (issue 4)")
		},
	}
}
