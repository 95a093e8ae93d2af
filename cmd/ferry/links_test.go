package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/testmodel"
)

// hfSnapshot lays src out as the Hugging Face cache does: every file is
// models--org--name/blobs/<sha256>, linked from snapshots/<rev>/<file> by
// ../../blobs/<sha256>. It returns the snapshot directory.
func hfSnapshot(t *testing.T, src string) string {
	t.Helper()
	repo := filepath.Join(t.TempDir(), "models--org--"+filepath.Base(src))
	snap := filepath.Join(repo, "snapshots", strings.Repeat("5e", 20))
	if err := os.MkdirAll(snap, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(repo, "blobs"), 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256(b)
		name := hex.EncodeToString(h[:])
		if err := os.WriteFile(filepath.Join(repo, "blobs", name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..", "..", "blobs", name), filepath.Join(snap, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	return snap
}

// linkOut makes dir/name a symlink to a file outside dir: an existing
// dir/name is moved out first (its bytes stay what the command reads),
// else the link points at secret.
func linkOut(t *testing.T, dir, name, secret string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	target := secret
	if _, err := os.Stat(p); err == nil {
		target = filepath.Join(t.TempDir(), name)
		if err := os.Rename(p, target); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
	real, err := filepath.EvalSymlinks(target)
	if err != nil {
		t.Fatal(err)
	}
	return real
}

// One symlink policy for every command that reads a model directory: a
// file linking outside it (generation_config.json, notes.txt, the adapter's
// weights) is bad input naming the link and its target, nothing is
// written; --follow-links reads it; a Hugging Face cache snapshot (links
// into ../../blobs/) is read without the flag.
func TestSymlinkPolicy(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret.txt")
	if err := os.WriteFile(secret, []byte("root:x:0:0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ct := func(t *testing.T) string {
		dir := filepath.Join(t.TempDir(), "ct")
		if err := testmodel.CompressedDeepSeekV3(1).Write(dir); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	cp := func(src string) func(t *testing.T) string {
		return func(t *testing.T) string {
			dir := filepath.Join(t.TempDir(), filepath.Base(src))
			copyDir(t, src, dir)
			return dir
		}
	}
	// A command reads model dir(s) made by dirs and writes under out; each
	// case links one file of one of its dirs out.
	type link struct {
		dir  int
		file string
	}
	aux := []link{{0, "generation_config.json"}, {0, "notes.txt"}, {0, "config.json"}}
	cmds := []struct {
		name  string
		dirs  []func(t *testing.T) string
		args  func(dirs []string, out string) []string
		links []link
	}{
		{"merge", []func(*testing.T) string{cp(qwen35Base), cp(qwen35DoRA)}, func(d []string, out string) []string {
			return []string{"merge", "--base", d[0], "--adapter", d[1], "--out", out}
		}, append(aux, link{1, "adapter_model.safetensors"}, link{1, "adapter_config.json"}, link{0, "model-00002-of-00007.safetensors"})},
		{"gguf convert", []func(*testing.T) string{cp(qwen35Base)}, func(d []string, out string) []string {
			return []string{"gguf", "convert", d[0], "--out", out}
		}, append(aux, link{0, "tokenizer.json"})},
		{"mlx repack", []func(*testing.T) string{ct}, func(d []string, out string) []string {
			return []string{"mlx", "repack", "--src", d[0], "--dst", out}
		}, aux},
		{"verify mtp", []func(*testing.T) string{cp(qwen35Base)}, func(d []string, out string) []string {
			return []string{"verify", "mtp", "--require", d[0]}
		}, aux},
		{"inspect", []func(*testing.T) string{cp(qwen35Base)}, func(d []string, out string) []string {
			return []string{"inspect", d[0]}
		}, aux},
		{"inspect adapter", []func(*testing.T) string{cp(qwen35DoRA)}, func(d []string, out string) []string {
			return []string{"inspect", d[0]}
		}, []link{{0, "adapter_model.safetensors"}, {0, "notes.txt"}}},
	}
	run := func(t *testing.T, args ...string) (string, int) {
		s, code, err := runFerry(t, args...)
		if err != nil {
			s += "\nerror: " + err.Error()
		}
		return s, code
	}
	for _, c := range cmds {
		for _, l := range c.links {
			t.Run(c.name+"/"+l.file, func(t *testing.T) {
				var dirs []string
				for _, mk := range c.dirs {
					dirs = append(dirs, mk(t))
				}
				target := linkOut(t, dirs[l.dir], l.file, secret)
				link := filepath.Join(dirs[l.dir], l.file)
				out := filepath.Join(t.TempDir(), "out")
				s, code := run(t, c.args(dirs, out)...)
				if code != exitBadInput || !strings.Contains(s, link) || !strings.Contains(s, target) || !strings.Contains(s, "--follow-links") {
					t.Fatalf("exit %d, want 2 naming %s and %s:\n%s", code, link, target, s)
				}
				if _, err := os.Stat(out); !os.IsNotExist(err) {
					t.Errorf("a refused %s wrote %s", c.name, out)
				}
				s, code = run(t, append(c.args(dirs, out), "--follow-links")...)
				if code != exitOK {
					t.Fatalf("--follow-links: exit %d\n%s", code, s)
				}
				if l.file == "notes.txt" && c.name == "merge" {
					if b, err := os.ReadFile(filepath.Join(out, "notes.txt")); err != nil || string(b) != "root:x:0:0\n" {
						t.Errorf("--follow-links: merged notes.txt %q %v", b, err)
					}
				}
			})
		}
		t.Run(c.name+"/Hugging Face cache", func(t *testing.T) {
			var dirs []string
			for _, mk := range c.dirs {
				dirs = append(dirs, hfSnapshot(t, mk(t)))
			}
			out := filepath.Join(t.TempDir(), "out")
			if s, code := run(t, c.args(dirs, out)...); code != exitOK {
				t.Fatalf("snapshot: exit %d\n%s", code, s)
			}
		})
	}
}
