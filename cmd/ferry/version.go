package main

import (
	"runtime"

	"github.com/urfave/cli/v2"
)

// versionInfo is `ferry version --json`.
type versionInfo struct {
	Name    string `json:"name"`
	Version string `json:"version"` // the release (releaseVersion), as records hold it
	Build   string `json:"build"`   // the build stamp (version)
	Go      string `json:"go"`      // the toolchain that built this binary
	OS      string `json:"os"`
	Arch    string `json:"arch"`
}

// versionCommand is `ferry version`: the line --version prints, printed by
// the same printer; --json gives the same facts, and the platform, as an
// object for scripts.
func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print ferry's version (what --version prints)",
		Flags: []cli.Flag{jsonFlag("print the version, build, Go toolchain and platform as JSON")},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usageErrorf("version takes no arguments, got %q", c.Args().Slice())
			}
			if c.Bool("json") {
				return printJSON(c, versionInfo{Name: c.App.Name, Version: releaseVersion, Build: version,
					Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH})
			}
			cli.VersionPrinter(c)
			return nil
		},
	}
}
