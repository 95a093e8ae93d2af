package main

import "github.com/urfave/cli/v2"

// followLinksFlag is the one switch of ferry's symlink policy on every
// command that reads a model directory (internal/fsutil): without it a file
// that is a symlink resolving outside the directory is bad input.
func followLinksFlag() cli.Flag {
	return &cli.BoolFlag{Name: "follow-links", Usage: "read files that are symlinks resolving outside the model directory (refused by default; links into a Hugging Face cache or a ferry store are always fine)"}
}
