package main

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

// pipelineCommand is not built yet: it says so and exits 1 rather than pretend.
func pipelineCommand() *cli.Command {
	return &cli.Command{
		Name:            "pipeline",
		Usage:           "run, plan and show a pipeline file (not built yet)",
		SkipFlagParsing: true,
		Action: func(*cli.Context) error {
			return fmt.Errorf("'ferry pipeline' is not built yet (issue 3)")
		},
	}
}
