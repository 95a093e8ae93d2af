package main

import "github.com/urfave/cli/v2"

// withUsageErrors gives every command (and subcommand) without its own
// OnUsageError the app's rule: a flag-parsing error is a usage error, exit
// 2. urfave/cli applies App.OnUsageError to the app's own flags only.
func withUsageErrors(app *cli.App) *cli.App {
	var walk func([]*cli.Command)
	walk = func(cmds []*cli.Command) {
		for _, c := range cmds {
			if c.OnUsageError == nil {
				c.OnUsageError = func(_ *cli.Context, err error, _ bool) error {
					return usageErrorf("%v", err)
				}
			}
			walk(c.Subcommands)
		}
	}
	walk(app.Commands)
	return app
}
