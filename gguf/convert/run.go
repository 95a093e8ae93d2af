package convert

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/internal/cpushare"
	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/safetensors"
)

// RunOptions tune Run.
type RunOptions struct {
	// Jobs is the number of tensor workers (default: the core count).
	Jobs int
	// Progress receives checkpoint bytes consumed (resumed tensors
	// included), from any worker goroutine.
	Progress func(n int64)
	// Journal is the resume journal's path (default out + ".journal").
	Journal string
	// TensorDone, if set, is called (from worker goroutines) after tensor
	// i's bytes are written, before they are durable.
	TensorDone func(i int, name string)
	// Digest asks for the finished file's sha256 (RunResult.Digest),
	// hashed while it is written (WriteOptions.Digest).
	Digest bool
	// Cores is WriteOptions.Cores.
	Cores *cpushare.Share
	// NonFinite is WriteOptions.NonFinite.
	NonFinite func(i int, name string, n int64)
	// NoSync writes the file as cp does, without fsync
	// (gguf.Options.NoSync); the journal then resumes only in the same
	// boot (gguf.OpenTensorJournal).
	NoSync bool
	// JournalEvery is how often durable tensors are recorded
	// (gguf.TensorJournal.Every; 0: a second). Kill tests make it short.
	JournalEvery time.Duration
}

// RunResult says what Run did, and after a failure what is left to resume
// (gguf.Leftover).
type RunResult struct {
	Resumed int            // tensors kept from an interrupted run
	Digest  hashing.Digest // sha256 of the finished file (RunOptions.Digest; one file only)
	Size    int64          // bytes written (the parts' together, for a split)
	// Files are the files written (Plan.Layout.Files: the file, or every
	// part of a split), each with its size and, with RunOptions.Digest,
	// its sha256.
	Files []File
	gguf.Leftover
}

// File is one file a run wrote.
type File struct {
	Path   string
	Size   int64
	Digest hashing.Digest
}

// Run owns a conversion's whole write lifecycle; `ferry gguf convert` and
// the pipeline's gguf stage both call it. The tensors go to out.partial
// (WriteOptions.Resume), and the internal/journal journal at
// RunOptions.Journal records, after each fsync of the partial file (about
// once a second), which tensors are durable; its ref is Stamp, so other
// inputs or options start over. Once out is renamed into place the journal
// is removed: a finished output leaves only the file. An interrupted or
// failed run leaves out.partial and the journal for a resume, or nothing
// when no partial file was made (a disk too full to reserve it). A plan
// with a split (Options.Split) writes the parts (Plan.Layout.Files), each
// as PART.partial, under one journal, and renames them into place
// together once all are whole (gguf.Writer).
func Run(ctx context.Context, ck *safetensors.Checkpoint, p *Plan, out string, o RunOptions) (*RunResult, error) {
	jpath := o.Journal
	if jpath == "" {
		jpath = out + ".journal"
	}
	files := p.Layout.Files(out)
	j, err := gguf.OpenTensorJournalFiles(jpath, files, Stamp(ck, p), o.NoSync)
	if err != nil {
		return nil, err
	}
	if o.JournalEvery > 0 {
		j.Every = o.JournalEvery
	}
	res := &RunResult{Size: p.Layout.OutputSize()}
	for k, fl := range p.Layout.FileLayouts() {
		res.Files = append(res.Files, File{Path: files[k], Size: fl.Size})
	}
	var digests func([][]byte)
	if o.Digest {
		digests = func(sums [][]byte) {
			for k, s := range sums {
				copy(res.Files[k].Digest[:], s)
			}
			if len(sums) == 1 {
				res.Digest = res.Files[0].Digest
			}
		}
	}
	err = Write(ctx, p, out, WriteOptions{
		Jobs: o.Jobs, NoSync: o.NoSync, Progress: o.Progress, Resume: true, Cores: o.Cores,
		Verify: func(i int, name string, _ *io.SectionReader) bool {
			if j.Has(i, name) {
				res.Resumed++
				return true
			}
			return false
		},
		TensorDone: func(i int, name string) {
			j.Done(i, name)
			if o.TensorDone != nil {
				o.TensorDone(i, name)
			}
		},
		FileDigests: digests,
		NonFinite:   o.NonFinite,
	})
	if err != nil {
		res.Leftover = j.Abandon()
		return res, err
	}
	if err := j.Remove(); err != nil {
		return nil, err
	}
	return res, nil
}

// Stamp identifies a conversion: the planned header (every KV and tensor
// info, so the options too) and each input shard's path, size and
// modification time.
func Stamp(ck *safetensors.Checkpoint, p *Plan) string {
	h := sha256.New()
	h.Write(p.Layout.Header)
	if p.Layout.Split != nil {
		for _, hd := range p.Layout.StampHeaders() {
			fmt.Fprintf(h, "\x00part\x00%d\x00", len(hd))
			h.Write(hd)
		}
	}
	for _, s := range ck.Shards {
		var mt int64
		if st, err := os.Stat(s.Path); err == nil {
			mt = st.ModTime().UnixNano()
		}
		fmt.Fprintf(h, "\x00%s\x00%d\x00%d", s.Path, s.Size, mt)
	}
	return hex.EncodeToString(h.Sum(nil))
}
