package merge

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"io"
	"os"
	"path/filepath"

	"github.com/ferry-llm/ferry/internal/workers"
)

// hashSink is a shardSink that keeps only the bytes' SHA-256.
type hashSink struct {
	h hash.Hash
	n int64
}

func (s *hashSink) Write(p []byte) (int, error) {
	s.h.Write(p)
	s.n += int64(len(p))
	return len(p), nil
}

func (s *hashSink) Written() int64 { return s.n }

// Digests computes the digest and size of each shard Execute writes with
// the same plan and options, without writing anything: a merged shard's
// tensors are computed as Execute computes them and only hashed; a copied
// shard is the base's file, hashed. A caller that stores the shards
// elsewhere (the pipeline's shared store, where a blob is named by its
// digest) can then start storing each while Execute still writes it.
// Shards are done opt.Shards at a time in the plan's order, as Execute
// writes them, but those skip names (nil: none; e.g. the shards an
// earlier run finished, which Execute keeps); each is called (from the
// shard's goroutine) with each digest once known;
// Progress, NonFinite, ShardDone and ShardOpened are not called. It uses
// its own Jobs workers and row-block buffers beside an Execute's; given
// Cores of a lower priority than the Execute's (cpushare.Share.Idle), it
// computes only on the cores the Execute leaves idle.
func Digests(ctx context.Context, p *Plan, opt ExecOptions, skip func(name string) bool, each func(FileDigest) error) error {
	opt = opt.withDefaults()
	opt = ExecOptions{Jobs: opt.Jobs, Shards: opt.Shards, BlockElems: opt.BlockElems, AllowNonFinite: opt.AllowNonFinite, Cores: opt.Cores}
	e := &executor{p: p, opt: opt, free: make(chan *block, opt.Shards*opt.Jobs)}
	return workers.Each(ctx, len(p.Shards), opt.Shards, func(ctx context.Context, i int) error {
		sp := p.Shards[i]
		if skip != nil && skip(sp.Name) {
			return nil
		}
		s := &hashSink{h: sha256.New()}
		var err error
		if sp.Rewrite {
			err = e.rewriteShard(ctx, sp, s)
		} else {
			err = hashCopy(ctx, filepath.Join(p.BaseDir, sp.Name), s)
		}
		if err != nil {
			return err
		}
		return each(FileDigest{Name: sp.Name, Size: s.n, SHA256: hex.EncodeToString(s.h.Sum(nil))})
	})
}

// hashCopy hashes the file a copied shard is a copy of.
func hashCopy(ctx context.Context, src string, s *hashSink) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := f.Read(buf)
		s.Write(buf[:n])
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
