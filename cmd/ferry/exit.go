package main

import (
	"errors"
	"fmt"
	"io/fs"
)

// Exit codes, documented in the README.
const (
	exitOK       = 0
	exitFailure  = 1
	exitBadInput = 2 // usage error or bad input
	exitVerify   = 3 // a verification ran and failed
)

// exitError carries an explicit exit code.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return &exitError{code: exitBadInput, err: fmt.Errorf(format, args...)}
}

func verifyFailed(err error) error { return &exitError{code: exitVerify, err: err} }

// badInput is implemented by the error types of the format packages
// (safetensors.Error, …) whose errors mean the input is wrong.
type badInput interface{ BadInput() bool }

// exitCode maps an error to the documented exit code.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	var bi badInput
	if errors.As(err, &bi) && bi.BadInput() {
		return exitBadInput
	}
	if errors.Is(err, fs.ErrNotExist) {
		return exitBadInput
	}
	return exitFailure
}
