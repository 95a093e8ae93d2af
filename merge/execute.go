package merge

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/ferry-llm/ferry/internal/cpushare"
	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/internal/inputerr"
	"github.com/ferry-llm/ferry/internal/workers"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// ExecOptions tune Execute.
type ExecOptions struct {
	// Jobs is the number of row-block workers of each shard being written
	// (default: the CPU count). The output bytes do not depend on it.
	Jobs int
	// Shards is how many shards are written at once, each by its own
	// goroutine that hashes its bytes as it writes them (default
	// DefaultShards(Jobs)). The output bytes do not depend on it.
	Shards int
	// Progress, if set, is called with base bytes done (read, merged and
	// written, or copied, or kept from an earlier run) and the total, one
	// call at a time and done never decreasing (the shards being written
	// report from their own goroutines).
	Progress func(done, total int64)
	// BlockElems is the target row-block size in elements (default
	// DefaultBlockElems). Blocks are whole rows; the block size depends only
	// on this and the tensor's width, never on Jobs.
	BlockElems int
	// AllowNonFinite writes merged tensors even where the adapter makes a
	// value NaN or ±Inf (see finite.go); by default that is refused.
	AllowNonFinite bool
	// NonFinite, if set, is called once per merged tensor whose base holds
	// NaN or ±Inf (carried through the merge as they are), with their count
	// (module: index into Plan.Modules), one call at a time, in no set
	// order between shards. Shards kept from an earlier run are not scanned.
	NonFinite func(module int, tensor string, n int64)
	// CheckpointEvery is how often the shard being written is made durable
	// and its position and hash state journaled (default
	// DefaultCheckpointEvery), at the first write boundary after it is due.
	CheckpointEvery time.Duration
	// ShardDone, if set, is called with each shard once it is whole and
	// durable under its name in the output directory (written by this run
	// or kept from an earlier one), from the goroutine that wrote it, while
	// the other shards are still being written: a caller can hand the file
	// on (the pipeline uploads it to a shared store) before the merge ends.
	// An error it returns fails the merge.
	ShardDone func(FileDigest) error
	// ShardOpened, if set, is called with each shard this run writes as
	// its partial file is opened (again, if the shard starts over): path
	// is that file, and flushed says how many of its bytes are in it so
	// far (a reader can read that far; it reaches the shard's size before
	// ShardDone). The file is renamed into place when whole: a reader
	// opens it here. Called from the goroutine writing the shard.
	ShardOpened func(name, path string, flushed func() int64)
	// Cores, if set, are the process's cores shared by priority
	// (cpushare): each row block's worker takes one while it computes the
	// block (not while it waits for the shard's writer, which waits for
	// the disk). Nil: none taken.
	Cores *cpushare.Share
}

// withDefaults fills in the workers, the shards at once and the block
// size left zero.
func (opt ExecOptions) withDefaults() ExecOptions {
	if opt.Jobs <= 0 {
		opt.Jobs = runtime.NumCPU()
	}
	if opt.Shards <= 0 {
		opt.Shards = DefaultShards(opt.Jobs)
	}
	if opt.BlockElems <= 0 {
		opt.BlockElems = DefaultBlockElems
	}
	return opt
}

// DefaultBlockElems makes a row block about 1 MiB of float32.
const DefaultBlockElems = 1 << 18

// DefaultCheckpointEvery keeps what a kill can lose to a tenth of a second
// of writing.
const DefaultCheckpointEvery = 100 * time.Millisecond

// FileDigest is one output file.
type FileDigest struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"` // hex, as sha256sum prints it
}

// Digest is the file's content address.
func (f FileDigest) Digest() (digest.Digest, error) { return digest.FromHex(f.SHA256) }

// Result says what Execute did.
type Result struct {
	OutDir  string       `json:"out"`
	Files   []FileDigest `json:"files"`   // shards, aux files and index, in write order
	Resumed []string     `json:"resumed"` // shards kept whole from an earlier run
	Written []string     `json:"written"` // shards written (or finished) by this run
}

// Execute carries out the plan into outDir and owns the merge's whole
// write lifecycle; the CLI and the pipeline stage both call it. Aux files
// are copied, then every shard (copied verbatim or rewritten) is written to
// .NAME.partial while hashing, with its position and sha256 state journaled
// (JournalName) at write boundaries, and renamed into place when whole;
// then the index is written last and the journal removed, so a finished
// output holds only the checkpoint's own files. A killed or interrupted
// run, re-run with the same inputs, keeps finished shards (by their stamp,
// re-hashed only if it changed) and continues the shard it was writing from
// its last checkpoint, so progress never goes back; it ends with the bytes
// of an uninterrupted merge. Execute makes no decisions of its own.
func Execute(ctx context.Context, p *Plan, outDir string, opt ExecOptions) (*Result, error) {
	opt = opt.withDefaults()
	if opt.CheckpointEvery <= 0 {
		opt.CheckpointEvery = DefaultCheckpointEvery
	}
	if !opt.AllowNonFinite {
		if err := checkAdapterFinite(p); err != nil {
			return nil, err
		}
	}
	if err := checkOutDir(p, outDir); err != nil {
		return nil, err
	}
	j, err := openJournal(outDir, p.Key)
	if err != nil {
		return nil, err
	}
	defer j.close()
	j.removeStale()
	e := &executor{p: p, out: outDir, opt: opt, j: j, free: make(chan *block, opt.Shards*opt.Jobs)}
	e.progress(0)
	res := &Result{OutDir: outDir}

	for _, a := range p.AuxFiles {
		d, err := copyFile(ctx, filepath.Join(p.BaseDir, a), filepath.Join(outDir, a), nil)
		if err != nil {
			return nil, err
		}
		res.Files = append(res.Files, d)
	}
	weightMap := map[string]string{}
	var total int64
	for _, sp := range p.Shards {
		for _, t := range sp.Tensors {
			weightMap[t.Name] = sp.Name
			sz, _ := tensor.ByteSize(t.DType, t.Shape)
			total += sz
		}
	}
	// Shards are written opt.Shards at a time, each by its own goroutine
	// (its bytes hashed there as they are written); the files keep the
	// plan's order in the result.
	files := make([]FileDigest, len(p.Shards))
	resumed := make([]bool, len(p.Shards))
	err = workers.Each(ctx, len(p.Shards), opt.Shards, func(ctx context.Context, i int) error {
		sp := p.Shards[i]
		if d, ok := j.finished(ctx, sp.Name); ok {
			e.advance(sp.Size)
			files[i], resumed[i] = d, true
			return e.shardDone(d)
		}
		d, err := e.writeShard(ctx, sp)
		files[i] = d
		if err != nil {
			return err
		}
		return e.shardDone(d)
	})
	if err != nil {
		return nil, err
	}
	for i, sp := range p.Shards {
		res.Files = append(res.Files, files[i])
		if resumed[i] {
			res.Resumed = append(res.Resumed, sp.Name)
		} else {
			res.Written = append(res.Written, sp.Name)
		}
	}
	if !p.Single {
		if err := safetensors.WriteIndex(outDir, weightMap, total, p.IndexMeta); err != nil {
			return nil, err
		}
		d, err := digestFile(ctx, filepath.Join(outDir, safetensors.IndexName))
		if err != nil {
			return nil, err
		}
		res.Files = append(res.Files, d)
	}
	if err := j.remove(); err != nil {
		return nil, err
	}
	e.progress(p.TotalBytes)
	return res, nil
}

// checkOutDir refuses to write over, into or around an input
// (fsutil.CheckApart), or into a directory that is not empty and not an
// unfinished run of a merge (a finished one keeps no journal).
func checkOutDir(p *Plan, outDir string) error {
	err := fsutil.CheckApart(outDir, true, p.BaseDir, p.AdapterDir)
	var ie *inputerr.Error
	if errors.As(err, &ie) {
		return inputErr(outDir, "", -1, ErrOutputExists, "%w", ie.Err)
	}
	if err != nil {
		return err
	}
	if st, err := os.Stat(outDir); err == nil && !st.IsDir() {
		return inputErr(outDir, "", -1, ErrOutputExists, "it exists and is not a directory; choose another --out")
	}
	ents, err := os.ReadDir(outDir)
	if errors.Is(err, os.ErrNotExist) {
		return os.MkdirAll(outDir, 0o755)
	}
	if err != nil {
		return err
	}
	if len(ents) == 0 {
		return nil
	}
	if _, err := os.Stat(filepath.Join(outDir, JournalName)); err != nil {
		return inputErr(outDir, "", -1, ErrOutputExists, "it exists and is not empty, and holds no %s of an interrupted ferry merge (a finished merge keeps none); choose another --out or remove it", JournalName)
	}
	return nil
}

type executor struct {
	p    *Plan
	out  string
	opt  ExecOptions
	j    *mergeJournal
	done int64
	mu   sync.Mutex
	// free holds row-block buffers for reuse across tensors: with at most
	// Jobs blocks in flight per shard being written, merge memory stays
	// Shards × Jobs × one block.
	free chan *block
	// copyBufs holds the buffers of byte-for-byte copies, one per shard
	// being written.
	copyBufs sync.Pool
}

// DefaultShards is how many shards a merge with jobs row-block workers
// writes at once: one per four workers, one to four. One shard's bytes go
// through one goroutine that also hashes them (SHA-256, 1-2 GB/s a core):
// shard after shard, the anchors.md slice's merge (9 GB) on 16 cores spent
// most of its time there with the other cores idle. On a few cores one
// shard keeps them busy, and a merge killed and resumed (each resumed
// DoRA tensor recomputes its column norms first) redoes the least.
func DefaultShards(jobs int) int { return min(4, max(1, jobs/4)) }

// copyBuf returns a buffer for copySection; putCopyBuf gives it back.
func (e *executor) shardDone(d FileDigest) error {
	if e.opt.ShardDone == nil {
		return nil
	}
	return e.opt.ShardDone(d)
}

func (e *executor) copyBuf() *[]byte {
	if b, ok := e.copyBufs.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 1<<20)
	return &b
}

func (e *executor) putCopyBuf(b *[]byte) { e.copyBufs.Put(b) }

func (e *executor) progress(done int64) {
	if e.opt.Progress != nil {
		e.opt.Progress(done, e.p.TotalBytes)
	}
}

// advance counts n more bytes done and reports the total, in order: the
// shards being written report from their own goroutines.
func (e *executor) advance(n int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.done += n
	e.progress(e.done)
}

// copyFile copies src to dst atomically, hashing it as it is written.
func copyFile(ctx context.Context, src, dst string, advance func(int64)) (FileDigest, error) {
	d, n, err := fsutil.CopyAtomic(ctx, dst, src, advance)
	if err != nil {
		return FileDigest{}, err
	}
	return FileDigest{Name: filepath.Base(dst), Size: n, SHA256: d.Hex()}, nil
}

func digestFile(ctx context.Context, path string) (FileDigest, error) {
	d, n, err := hashing.File(ctx, path, nil)
	if err != nil {
		return FileDigest{}, err
	}
	return FileDigest{Name: filepath.Base(path), Size: n, SHA256: d.Hex()}, nil
}
