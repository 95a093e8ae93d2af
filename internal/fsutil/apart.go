package fsutil

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/ferry-llm/ferry/internal/inputerr"
)

// ErrOverInput reports an output that would write over or inside one of
// the command's inputs.
var ErrOverInput = errors.New("output over an input")

// ResolveExisting makes p absolute and resolves the symlinks in its
// longest existing prefix; the part that does not exist yet is kept as
// written.
func ResolveExisting(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		p = a
	}
	var rest []string
	for cur := p; ; cur = filepath.Dir(cur) {
		if r, err := filepath.EvalSymlinks(cur); err == nil {
			return filepath.Join(append([]string{r}, rest...)...)
		}
		if cur == filepath.Dir(cur) {
			return p
		}
		rest = append([]string{filepath.Base(cur)}, rest...)
	}
}

// existing is a path and what it names.
type existing struct {
	path string
	fi   fs.FileInfo
}

// ancestors are p and each directory above it that exists, nearest first,
// each as what it names through symlinks.
func ancestors(p string) []existing {
	var as []existing
	for cur := p; ; cur = filepath.Dir(cur) {
		if fi, err := os.Stat(cur); err == nil {
			as = append(as, existing{cur, fi})
		}
		if cur == filepath.Dir(cur) {
			return as
		}
	}
}

// CheckApart is the one rule for where a command may write: never over
// one of its inputs, never inside one, and, when the output is a directory
// (outIsDir), never a directory that holds one. Paths are compared by what
// they name once symlinks are followed (os.SameFile on the existing part
// of each path, so a link, a case-insensitive spelling or a bind mount
// does not hide an input). An input directory's entries that are symlinks
// count as inputs too, by their targets: writing over the blob a Hugging
// Face cache snapshot links to would change the input as surely.
//
// The error is a bad-input *inputerr.Error naming out (exit code 2);
// nothing is created either way.
func CheckApart(out string, outIsDir bool, inputs ...string) error {
	// What out names once its existing part is resolved: a link to an
	// input file is that file.
	abs := ResolveExisting(out)
	outAnc := ancestors(abs)
	var outFI fs.FileInfo // nil when out does not exist
	if len(outAnc) > 0 && outAnc[0].path == abs {
		outFI = outAnc[0].fi
	}
	refuse := func(format string, args ...any) error {
		return inputerr.New(out, "", -1, ErrOverInput, format+"; inputs are never modified, choose another output", args...)
	}
	for _, in := range inputs {
		for _, it := range inputItems(in) {
			for _, a := range outAnc {
				if !os.SameFile(a.fi, it.fi) {
					continue
				}
				switch {
				case a.path == abs && it.via == "":
					return refuse("it is the input %s", in)
				case a.path == abs:
					return refuse("it is %s, the target of the input's link %s", it.path, it.via)
				case it.via == "":
					return refuse("it is inside the input %s", in)
				default:
					return refuse("it is inside %s, the target of the input's link %s", it.path, it.via)
				}
			}
			if outFI == nil || !outIsDir {
				continue
			}
			for _, a := range ancestors(it.path) {
				if os.SameFile(a.fi, outFI) {
					if it.via == "" {
						return refuse("the input %s is inside it", in)
					}
					return refuse("%s, the target of the input's link %s, is inside it", it.path, it.via)
				}
			}
		}
	}
	return nil
}

// inputItem is an input path, or the target of a symlink in an input
// directory (via: the link).
type inputItem struct {
	path string
	via  string
	fi   fs.FileInfo
}

// inputItems are in itself and, for a directory, the targets of the
// symlinks directly in it. Paths that do not exist are skipped: an input
// that is not there cannot be written over.
func inputItems(in string) []inputItem {
	r, err := filepath.EvalSymlinks(in)
	if err != nil {
		return nil
	}
	fi, err := os.Stat(r)
	if err != nil {
		return nil
	}
	items := []inputItem{{path: r, fi: fi}}
	if !fi.IsDir() {
		return items
	}
	ents, err := os.ReadDir(r)
	if err != nil {
		return items
	}
	for _, e := range ents {
		if e.Type()&fs.ModeSymlink == 0 {
			continue
		}
		link := filepath.Join(in, e.Name())
		t, err := filepath.EvalSymlinks(link)
		if err != nil {
			continue
		}
		if tfi, err := os.Stat(t); err == nil {
			items = append(items, inputItem{path: t, via: link, fi: tfi})
		}
	}
	return items
}
