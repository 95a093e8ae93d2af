package jsonout

import (
	"bytes"
	"testing"
)

func TestWrite(t *testing.T) {
	var b bytes.Buffer
	if err := Write(&b, map[string]any{"path": "a<b>&c", "n": []int{1}}); err != nil {
		t.Fatal(err)
	}
	want := "{\n  \"n\": [\n    1\n  ],\n  \"path\": \"a<b>&c\"\n}\n"
	if b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
}
