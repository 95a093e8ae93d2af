package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/internal/errkind"
)

// Exit codes, documented in the README. This file is the one place that
// maps errors to them: packages classify their errors (internal/errkind)
// and never choose an exit code.
const (
	exitOK          = 0
	exitFailure     = 1   // failure, a feature not built, a retryable I/O error that did not pass
	exitBadInput    = 2   // usage error or bad input
	exitVerify      = 3   // a verification ran and failed, or the store is damaged
	exitInterrupted = 130 // Ctrl-C or SIGTERM: what was written resumes (128 + SIGINT, as shells report it)
)

// exitCodes maps each error kind to its exit code.
var exitCodes = map[errkind.Kind]int{
	errkind.Failure:      exitFailure,
	errkind.Usage:        exitBadInput,
	errkind.BadInput:     exitBadInput,
	errkind.NotBuilt:     exitFailure,
	errkind.VerifyFailed: exitVerify,
	errkind.Retryable:    exitFailure,
	errkind.Interrupted:  exitInterrupted,
}

func usageErrorf(format string, args ...any) error {
	return errkind.Errorf(errkind.Usage, format, args...)
}

func verifyFailed(err error) error { return errkind.Mark(errkind.VerifyFailed, err) }

// interrupted marks err as the end of a run cancelled by a signal: whatever
// the error says (a closed file, a cancelled context deep in a stage), the
// run stopped because it was asked to.
func interrupted(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return errkind.Mark(errkind.Interrupted, err)
	}
	return err
}

// interruptedResume words the error of a resumable command that ctx's
// cancellation (Ctrl-C, SIGTERM) stopped, the same way for every such
// command: "interrupted; " what is and is not written, then how to resume
// (exit 130). It returns nil when err is not that cancellation.
func interruptedResume(ctx context.Context, err error, what string, args ...any) error {
	if ctx.Err() == nil || !errors.Is(err, ctx.Err()) {
		return nil
	}
	return errkind.Mark(errkind.Interrupted, fmt.Errorf("interrupted; %s; run the same command again to resume: %w", fmt.Sprintf(what, args...), err))
}

// tensorWriteFailed words the error of a GGUF write by tensor (gguf
// convert, quantize) that failed or was interrupted: out was not written,
// and what lo says is left to resume (of total tensors).
func tensorWriteFailed(ctx context.Context, err error, out string, lo gguf.Leftover, total int) error {
	what := out + " was not written"
	switch {
	case lo.Partial == "":
	case lo.JournalErr != nil:
		what += fmt.Sprintf(", and recording the last finished tensors in %s failed (%v), so a resume starts from the ones recorded before", lo.Journal, lo.JournalErr)
	default:
		what += fmt.Sprintf(": %d of %d tensors are durable in %s", lo.Durable, total, lo.Partial)
	}
	if ierr := interruptedResume(ctx, err, "%s", what); ierr != nil {
		return ierr
	}
	return err
}

// exitCode maps an error to the documented exit code.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	if code, ok := exitCodes[errkind.Of(err)]; ok {
		return code
	}
	return exitFailure
}
