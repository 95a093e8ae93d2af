package main

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

// mlxCommand is not built yet: it says so and exits 1 rather than pretend.
func mlxCommand() *cli.Command {
	return &cli.Command{
		Name:            "mlx",
		Usage:           "MLX repack and quantization (not built yet)",
		SkipFlagParsing: true,
		Action: func(*cli.Context) error {
			return fmt.Errorf("'ferry mlx' is not built yet (issue 7)")
		},
	}
}
