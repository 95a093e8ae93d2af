package manifest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ErrViewConflict reports a view path that holds something ferry did not
// put there.
var ErrViewConflict = errors.New("manifest: view path holds a file that is not a ferry symlink")

// MakeView makes dir a directory of relative symlinks, one per output, into
// the store's blobs (the layout of the Hugging Face cache). Links already
// right are left alone; each new or changed link is made under a temp name
// and renamed into place; ferry links that no output names any more are
// removed. Anything else found at an output's path is an error, never
// overwritten.
func (s *Store) MakeView(dir string, outs []Output) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	want := map[string]bool{}
	for _, o := range outs {
		if err := checkRelPath(o.Path); err != nil {
			return err
		}
		link := filepath.Join(dir, filepath.FromSlash(o.Path))
		want[link] = true
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			return err
		}
		target, err := filepath.Rel(filepath.Dir(link), s.BlobPath(o.Digest))
		if err != nil {
			return err
		}
		fi, err := os.Lstat(link)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return err
		case fi.Mode()&fs.ModeSymlink == 0:
			return fmt.Errorf("%s: %w", link, ErrViewConflict)
		default:
			if cur, err := os.Readlink(link); err == nil && cur == target {
				continue
			}
		}
		tmp := link + ".ferry-tmp"
		os.Remove(tmp)
		if err := os.Symlink(target, tmp); err != nil {
			return err
		}
		if err := os.Rename(tmp, link); err != nil {
			os.Remove(tmp)
			return err
		}
	}
	// Drop stale ferry links.
	err = filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if de.Type()&fs.ModeSymlink == 0 || want[p] {
			return nil
		}
		if t, err := os.Readlink(p); err == nil && isBlobLink(t) {
			return os.Remove(p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return nil
}

func isBlobLink(target string) bool {
	return strings.Contains(filepath.ToSlash(target), "blobs/"+Algorithm+"/")
}

// CheckView reports the first output whose link in dir is missing or points
// elsewhere ("" when the view is right). It reads no file data.
func (s *Store) CheckView(dir string, outs []Output) string {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err.Error()
	}
	for _, o := range outs {
		link := filepath.Join(dir, filepath.FromSlash(o.Path))
		cur, err := os.Readlink(link)
		if err != nil {
			return o.Path + ": missing"
		}
		want, _ := filepath.Rel(filepath.Dir(link), s.BlobPath(o.Digest))
		if cur != want {
			return o.Path + ": points elsewhere"
		}
	}
	return ""
}
