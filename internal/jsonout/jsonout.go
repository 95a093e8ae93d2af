// Package jsonout is ferry's one JSON emitter: every --json result and every
// JSON report a stage stores is written by Write, so they all share one
// layout (two-space indent, a final newline, '<', '>' and '&' as they are).
// A file whose format has that layout (a safetensors index: Python's
// json.dumps(indent=2, sort_keys=True) and a newline; Go sorts map keys)
// is written by Write too.
package jsonout

import (
	"encoding/json"
	"io"
)

// Write writes v to w as indented JSON followed by a newline.
func Write(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// Line writes v to w as one line of JSON (no indent) and a newline: the
// layout of event streams, one object per line.
func Line(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}
