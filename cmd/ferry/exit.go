package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

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
// (exit 130). The error that stopped the command stays in the chain
// (errors.Is) but not in the message: it is the cancellation's "context
// canceled", or what a write cut short by it said. It returns nil when
// err is not that cancellation.
func interruptedResume(ctx context.Context, err error, what string, args ...any) error {
	if ctx.Err() == nil || !errors.Is(err, ctx.Err()) {
		return nil
	}
	return &interruption{msg: "interrupted; " + fmt.Sprintf(what, args...) + "; run the same command again to resume", err: err}
}

// interruption is interruptedResume's error: its own message, err's chain.
type interruption struct {
	msg string
	err error
}

func (e *interruption) Error() string      { return e.msg }
func (e *interruption) Unwrap() error      { return e.err }
func (e *interruption) Kind() errkind.Kind { return errkind.Interrupted }

// errorMessage is what main prints for err, the error a command run under
// ctx ended with, after "ferry: ". This is the one place an error becomes
// the line a user reads, so it is where an interrupted command's message
// is made to say so: a command that words its interruption
// (interruptedResume, a pipeline run) already begins "interrupted"; any
// other gets that word first. Either way the cancellation's own words are
// taken out: Go's "context canceled" (a cancelled context deep in a stage
// or a lock wait) and ctx's cause ("interrupt signal received", which
// internal/workers passes on) are not news to a user who pressed Ctrl-C.
func errorMessage(ctx context.Context, err error) string {
	msg := err.Error()
	if errkind.Of(err) != errkind.Interrupted {
		return msg
	}
	words := []string{context.Canceled.Error()}
	if cause := context.Cause(ctx); cause != nil && cause.Error() != words[0] {
		words = append(words, cause.Error())
	}
	msg = without(msg, words)
	switch {
	case strings.HasPrefix(msg, "interrupted"):
		return msg
	case msg == "":
		return "interrupted"
	}
	return "interrupted: " + msg
}

// without removes each of words from an error message where a wrap put
// it (": " words), and drops lines that say nothing else (errors.Join puts
// one error a line).
func without(msg string, words []string) string {
	var keep []string
	for _, l := range strings.Split(msg, "\n") {
		for _, w := range words {
			if l == w {
				l = ""
			}
			l = strings.ReplaceAll(l, ": "+w, "")
		}
		if strings.TrimSpace(l) != "" {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
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
	case len(lo.Partials) > 1:
		what += fmt.Sprintf(": %d of %d tensors are durable in %s and the %d other parts' .partial files", lo.Durable, total, lo.Partial, len(lo.Partials)-1)
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
