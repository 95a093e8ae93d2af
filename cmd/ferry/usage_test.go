package main

import (
	"reflect"
	"strings"
	"testing"
)

func TestInterspersed(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"ferry gguf convert DIR --out F --outtype f16", "ferry gguf convert --out F --outtype f16 DIR"},
		{"ferry gguf convert --out F DIR --no-mtp", "ferry gguf convert --out F --no-mtp DIR"},
		{"ferry gguf convert DIR --out=F", "ferry gguf convert --out=F DIR"},
		{"ferry --verbose inspect PATH --json", "ferry --verbose inspect --json PATH"},
		{"ferry inspect PATH --parquet out.parquet", "ferry inspect --parquet out.parquet PATH"},
		{"ferry pipeline run FILE.yaml --force merged", "ferry pipeline run --force merged FILE.yaml"},
		{"ferry inspect -- -odd-name", "ferry inspect -- -odd-name"},
		{"ferry nosuch a --b", "ferry nosuch a --b"},
		{"ferry", "ferry"},
	}
	for _, tt := range tests {
		app := newApp()
		got := interspersed(app, strings.Fields(tt.in))
		if want := strings.Fields(tt.want); !reflect.DeepEqual(got, want) {
			t.Errorf("%q:\n got %q\nwant %q", tt.in, got, want)
		}
	}
}

// The issue's own spelling of the convert command must work end to end.
func TestFlagsAfterPositional(t *testing.T) {
	out := t.TempDir() + "/m.gguf"
	text, code, err := runFerry(t, "gguf", "convert", "../../testdata/models/qwen35-tiny/base", "--out", out, "--outtype", "f16")
	if code != 0 {
		t.Fatalf("exit %d: %v\n%s", code, err, text)
	}
	text, code, err = runFerry(t, "verify", "mtp", out, "--json")
	if code != 0 || !strings.Contains(text, `"ok"`) {
		t.Fatalf("verify mtp: exit %d: %v\n%s", code, err, text)
	}
}
