// Package ptytest opens pseudo-terminals for tests that check what ferry
// draws on a TTY (progress bars) versus what it logs elsewhere. Linux only.
package ptytest
