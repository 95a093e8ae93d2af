package fsutil

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/ferry-llm/ferry/internal/errkind"
)

// The symlink policy of every command that reads a model directory (merge,
// gguf convert, mlx repack, inspect, a pipeline import): a file in the
// directory that is a symlink resolving outside it is refused, so that a
// checkpoint whose notes.txt links to /etc/shadow is not copied into a
// merge or imported into a store, unless the user asks to follow links
// (--follow-links). Two kinds of links stay accepted:
//
//   - links to a content-addressed blob, a file named by its hex digest
//     (40 or 64 digits) in a directory called "blobs" wherever the link
//     finally resolves: the Hugging Face cache, whose snapshots/<rev>/file
//     links to ../../blobs/<hash>;
//   - links into a ferry store (<store>/blobs/sha256/<digest>, next to its
//     manifest.json): ferry's own views. Such a blob may itself be a link to
//     a file an import recorded in place; the import applied this policy
//     when it read that file.

// ErrLinkOutside is wrapped by every LinkError.
var ErrLinkOutside = errors.New("symlink resolves outside the model directory")

// LinkError is a symlink in a model directory that resolves outside it.
type LinkError struct {
	Path   string // the link, as found in the directory
	Target string // where it resolves
	Dir    string // the model directory
}

func (e *LinkError) Error() string {
	return fmt.Sprintf("%s: %v: links to %s, outside %s (use --follow-links if you trust it)", e.Path, ErrLinkOutside, e.Target, e.Dir)
}

func (e *LinkError) Unwrap() error { return ErrLinkOutside }

// Kind makes the error bad input (exit code 2).
func (e *LinkError) Kind() errkind.Kind { return errkind.BadInput }

// CheckLinks applies the policy to every entry of the model directory dir,
// recursively (entries whose names start with "." are skipped, as every
// reader skips them; a symlink to a directory is checked as one link and
// not descended into). It returns the first *LinkError in path order, nil
// when every link stays inside. A dir that is itself a symlink is fine:
// the user named it.
func CheckLinks(dir string) error {
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	return filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		if strings.HasPrefix(de.Name(), ".") {
			if de.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if de.Type()&fs.ModeSymlink == 0 {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		return CheckLink(dir, filepath.Join(dir, rel))
	})
}

// CheckLink applies the policy to one path p inside the model directory
// dir: nil when p is not a symlink, is broken (its reader reports that), or
// resolves inside dir, to a content-addressed blob or into a ferry store;
// a *LinkError otherwise.
func CheckLink(dir, p string) error {
	if !isLink(p) {
		return nil
	}
	// Hop by hop: a link into a ferry store is ferry's own.
	cur := p
	for hops := 0; hops < 64 && isLink(cur); hops++ {
		t, err := os.Readlink(cur)
		if err != nil {
			return nil
		}
		if !filepath.IsAbs(t) {
			t = filepath.Join(filepath.Dir(cur), t)
		}
		cur = filepath.Clean(t)
		if isStoreBlob(cur) {
			return nil
		}
	}
	target, err := filepath.EvalSymlinks(p)
	if err != nil {
		return nil
	}
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	if Inside(root, target) || isHexBlob(target) {
		return nil
	}
	return &LinkError{Path: p, Target: target, Dir: dir}
}

func isLink(p string) bool {
	fi, err := os.Lstat(p)
	return err == nil && fi.Mode()&fs.ModeSymlink != 0
}

// Inside reports whether path p is root or below it (both clean and
// absolute, or both relative to the same directory).
func Inside(root, p string) bool {
	rel, err := filepath.Rel(root, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

func isHex(s string, lens ...int) bool {
	ok := false
	for _, n := range lens {
		ok = ok || len(s) == n
	}
	if !ok {
		return false
	}
	for _, r := range s {
		if !strings.ContainsRune("0123456789abcdef", r) {
			return false
		}
	}
	return true
}

// isHexBlob: a file named by a hex digest under a directory called
// "blobs" (the Hugging Face cache's blobs/<sha1|sha256>, a ferry store's
// blobs/sha256/<sha256>).
func isHexBlob(target string) bool {
	if !isHex(filepath.Base(target), 40, 64) {
		return false
	}
	for _, part := range strings.Split(filepath.ToSlash(filepath.Dir(target)), "/") {
		if part == "blobs" {
			return true
		}
	}
	return false
}

// isStoreBlob: <store>/blobs/sha256/<64 hex digits>, with the store's
// manifest.json beside blobs/.
func isStoreBlob(p string) bool {
	algo := filepath.Dir(p)
	blobs := filepath.Dir(algo)
	if !isHex(filepath.Base(p), 64) || filepath.Base(algo) != "sha256" || filepath.Base(blobs) != "blobs" {
		return false
	}
	fi, err := os.Stat(filepath.Join(filepath.Dir(blobs), "manifest.json"))
	return err == nil && fi.Mode().IsRegular()
}
