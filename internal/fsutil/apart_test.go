package fsutil

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/inputerr"
)

func TestCheckApart(t *testing.T) {
	root := t.TempDir()
	mk := func(p string) string {
		p = filepath.Join(root, p)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	link := func(target, p string) string {
		p = filepath.Join(root, p)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ck := filepath.Dir(mk("models/ck/model-00001-of-00002.safetensors"))
	mk("models/blobs/b")
	link("../blobs/b", "models/ck/model-00002-of-00002.safetensors") // the HF cache layout
	alias := link("models/ck", "alias")
	file := mk("single.safetensors")
	fileLink := link("single.safetensors", "single-link.safetensors")
	os.MkdirAll(filepath.Join(root, "elsewhere"), 0o755)

	tests := []struct {
		name  string
		out   string
		isDir bool
		input string
		want  string // "" accepted, else part of the message
	}{
		{"a new file beside the input", filepath.Join(root, "models/m.gguf"), false, ck, ""},
		{"a new directory elsewhere", filepath.Join(root, "elsewhere/merged"), true, ck, ""},
		{"an existing directory elsewhere", filepath.Join(root, "elsewhere"), true, ck, ""},
		{"the input directory", ck, true, ck, "it is the input"},
		{"the input directory through a link", alias, true, ck, "it is the input"},
		{"the input named through a link", ck, true, alias, "it is the input"},
		{"over an input shard", filepath.Join(ck, "model-00001-of-00002.safetensors"), false, ck, "inside the input"},
		{"a new file inside the input", filepath.Join(ck, "m.gguf"), false, ck, "inside the input"},
		{"inside the input through a link", filepath.Join(alias, "model-00001-of-00002.safetensors"), false, ck, "inside the input"},
		{"not yet existing directories inside the input", filepath.Join(alias, "a/b/m.gguf"), false, ck, "inside the input"},
		{"relative path inside the input", relTo(t, filepath.Join(ck, "x.parquet")), false, ck, "inside the input"},
		{"over the blob a shard links to", filepath.Join(root, "models/blobs/b"), false, ck, "the target of the input's link"},
		{"a directory holding the input", filepath.Join(root, "models"), true, ck, "is inside it"},
		{"a directory holding the input, named through a link", root, true, alias, "is inside it"},
		{"a directory holding a shard's link target", filepath.Join(root, "models/blobs"), true, ck, "is inside it"},
		{"a file output is not a directory that holds", filepath.Join(root, "models"), false, ck, ""},
		{"the input file", file, false, file, "it is the input"},
		{"the input file through a link", fileLink, false, file, "it is the input"},
		{"a link to the input file as input", file, false, fileLink, "it is the input"},
		{"a missing input holds nothing", filepath.Join(root, "elsewhere/x"), false, filepath.Join(root, "gone"), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckApart(tt.out, tt.isDir, filepath.Join(root, "elsewhere/unrelated"), tt.input)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var ie *inputerr.Error
			if !errors.Is(err, ErrOverInput) || !errors.As(err, &ie) || !ie.BadInput() || ie.Path != tt.out {
				t.Fatalf("err %v, want a bad-input ErrOverInput naming %s", err, tt.out)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("message %q does not say %q", err, tt.want)
			}
		})
	}
}

func relTo(t *testing.T, p string) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	r, err := filepath.Rel(wd, p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestResolveExisting(t *testing.T) {
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(root, "real/sub"), 0o755)
	os.Symlink("real", filepath.Join(root, "link"))
	for in, want := range map[string]string{
		filepath.Join(root, "link/sub/new/file"): filepath.Join(root, "real/sub/new/file"),
		filepath.Join(root, "link"):              filepath.Join(root, "real"),
		filepath.Join(root, "none/x"):            filepath.Join(root, "none/x"),
	} {
		if got := ResolveExisting(in); got != want {
			t.Errorf("ResolveExisting(%s) = %s, want %s", in, got, want)
		}
	}
}
