package main

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

// storeCommand is not built yet: it says so and exits 1 rather than pretend.
func storeCommand() *cli.Command {
	return &cli.Command{
		Name:            "store",
		Usage:           "verify and garbage-collect the content-addressed store (not built yet)",
		SkipFlagParsing: true,
		Action: func(*cli.Context) error {
			return fmt.Errorf("'ferry store' is not built yet (issue 3)")
		},
	}
}
