package main

import (
	"strings"

	"github.com/urfave/cli/v2"
)

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

// interspersed rewrites args so that a command's flags may follow its
// positional arguments, as users of llama.cpp and mlx-lm type them
// (`ferry gguf convert DIR --out FILE`): urfave/cli v2 stops parsing flags
// at the first positional argument, so the leaf command's flags (with their
// values) are moved in front of its positionals. Everything after a literal
// "--" is left alone.
func interspersed(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	out := []string{args[0]}
	rest := args[1:]
	// Walk global flags and the command path.
	cmds := app.Commands
	var leaf *cli.Command
	for len(rest) > 0 {
		a := rest[0]
		if strings.HasPrefix(a, "-") {
			if leaf != nil {
				break
			}
			out = append(out, a) // a global flag (all are boolean)
			rest = rest[1:]
			continue
		}
		next := findCommand(cmds, a)
		if next == nil {
			break
		}
		leaf = next
		out = append(out, a)
		rest = rest[1:]
		cmds = next.Subcommands
		if len(cmds) == 0 {
			break
		}
	}
	if leaf == nil || leaf.SkipFlagParsing {
		return append(out, rest...)
	}
	takesValue := map[string]bool{}
	for _, f := range leaf.Flags {
		_, isBool := f.(*cli.BoolFlag)
		for _, n := range f.Names() {
			takesValue[n] = !isBool
		}
	}
	var flags, positional []string
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" {
			positional = append(positional, rest[i:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			positional = append(positional, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		if takesValue[name] && i+1 < len(rest) {
			i++
			flags = append(flags, rest[i])
		}
	}
	out = append(out, flags...)
	return append(out, positional...)
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

// unknownCommand is the usage error for a command line whose command path
// names a command that is not there ("ferry stroe du", "ferry store frob"),
// naming the help of the level it was looked for at; nil otherwise. A
// command with an action of its own (gguf, verify) judges its arguments
// itself.
func unknownCommand(app *cli.App, args []string) error {
	cmds, path := app.Commands, "ferry"
	help := false // after help: the command it is asked for
	for _, a := range args[1:] {
		switch {
		case a == "--":
			continue // the flags end; a command is still looked up
		case strings.HasPrefix(a, "-"):
			continue // a flag: the global ones are all boolean
		case (a == "help" || a == "h") && !help:
			help = true
			continue
		}
		next := findCommand(cmds, a)
		if next == nil {
			return usageErrorf("unknown command %q; see '%s --help'", a, path)
		}
		if help || len(next.Subcommands) == 0 || next.Action != nil {
			return nil
		}
		cmds, path = next.Subcommands, path+" "+next.Name
	}
	return nil
}

// argsCommand is the names of the commands the command line args runs,
// from the top ("pipeline run"), as far as they are known (commandPath
// once the command runs).
func argsCommand(app *cli.App, args []string) string {
	var names []string
	cmds := app.Commands
	for _, a := range args[1:] {
		if a == "--" || strings.HasPrefix(a, "-") {
			continue
		}
		next := findCommand(cmds, a)
		if next == nil {
			break
		}
		names = append(names, next.Name)
		if cmds = next.Subcommands; len(cmds) == 0 {
			break
		}
	}
	return strings.Join(names, " ")
}
