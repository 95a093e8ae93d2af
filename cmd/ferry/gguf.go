package main

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

// ggufCommand is not built yet: it says so and exits 1 rather than pretend.
func ggufCommand() *cli.Command {
	return &cli.Command{
		Name:            "gguf",
		Usage:           "GGUF conversion (not built yet)",
		SkipFlagParsing: true,
		Action: func(*cli.Context) error {
			return fmt.Errorf("'ferry gguf' is not built yet (issue 5)")
		},
	}
}
