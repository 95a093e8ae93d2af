package gguf

import (
	"github.com/ferry-llm/ferry/internal/hashfollow"
)

// HashFollower hashes the files a Writer is writing in file order while
// its units are written (WriteUnits, WriteUnitsMulti), reading each range
// back from the page cache once every unit before it is in the file, so a
// finished file is not read again for its digest. Units are planned in
// file order, and everything between them (header, padding, tensors a
// resumed run skipped) is in the file before Run starts. The
// parts of a split are hashed one after the other, each with its own
// hash: positions are offsets into their concatenation (Writer.ReadAt).
// Written(k) notes unit k in the file, Run hashes beside the workers
// (UnitWork.Also), Sums are the files' digests (Layout.Files' order).
type HashFollower = hashfollow.Follower

// NewHashFollower follows w, whose unit k's bytes begin at start[k] (in
// the concatenation ReadAt reads). The starts may not decrease: units
// out of file order are an error (names the first).
func NewHashFollower(w *Writer, start []int64) (*HashFollower, error) {
	regions := make([]hashfollow.Region, len(start))
	for k, s := range start {
		regions[k] = hashfollow.Region{Start: s, Unit: k}
	}
	paths := w.Paths()
	return hashfollow.New(w, w.FileBounds(), regions, len(start), func(i int) string { return paths[i] })
}
