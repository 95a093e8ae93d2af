package inputerr

import (
	"errors"
	"testing"

	"github.com/ferry-llm/ferry/internal/errkind"
)

func TestError(t *testing.T) {
	sentinel := errors.New("bad thing")
	tests := []struct {
		err  error
		want string
	}{
		{New("f.safetensors", "", -1, sentinel, ""), "f.safetensors: bad thing"},
		{New("f.safetensors", "w", 8, sentinel, "got %d", 3), `f.safetensors: tensor "w" at offset 8: bad thing: got 3`},
		{&Error{Path: "m.gguf", Key: "general.architecture", Offset: 24, Err: sentinel}, `m.gguf: key "general.architecture" at offset 24: bad thing`},
		{New("f", "", 0, sentinel, ""), "f at offset 0: bad thing"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("got %q, want %q", got, tt.want)
		}
		if !errors.Is(tt.err, sentinel) {
			t.Errorf("%q does not wrap its sentinel", tt.err)
		}
		var e *Error
		if !errors.As(tt.err, &e) || !e.BadInput() {
			t.Errorf("%q is not a bad-input *Error", tt.err)
		}
	}
}

// An input error takes the kind of what it wraps where that has one: a
// layout that is not built is not the user's fault.
func TestKind(t *testing.T) {
	tests := []struct {
		err  error
		want errkind.Kind
	}{
		{New("f", "", -1, errors.New("bad"), ""), errkind.BadInput},
		{New("f", "t", -1, errkind.ErrNotBuilt, "fused experts"), errkind.NotBuilt},
		{Wrap("f", errkind.Mark(errkind.Retryable, errors.New("reset"))), errkind.Retryable},
	}
	for _, tt := range tests {
		if got := errkind.Of(tt.err); got != tt.want {
			t.Errorf("%v: kind %v, want %v", tt.err, got, tt.want)
		}
		var e *Error
		if errors.As(tt.err, &e) && e.BadInput() != (tt.want == errkind.BadInput) {
			t.Errorf("%v: BadInput %v", tt.err, e.BadInput())
		}
	}
}
