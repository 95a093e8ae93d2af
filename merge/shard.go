package merge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/ferry-llm/ferry/safetensors"
)

// shardSink is where a shard's bytes go, in order: its partial file
// (shardOut), or only a hash (Digests).
type shardSink interface {
	io.Writer
	Written() int64 // bytes so far
}

// errNoResume says a checkpoint does not fall where the shard's writer can
// continue (another block size than the run that wrote it): the shard
// starts over.
var errNoResume = errors.New("checkpoint is not at a resumable position")

// writeShard writes one shard through its partial file, continuing an
// earlier run's checkpoint where there is one. On error the partial file
// and its last checkpoint stay for the next run.
func (e *executor) writeShard(ctx context.Context, sp ShardPlan) (FileDigest, error) {
	for attempt := 0; ; attempt++ {
		o, err := e.j.openShard(sp.Name, e.opt.CheckpointEvery)
		if err != nil {
			return FileDigest{}, err
		}
		if e.opt.ShardOpened != nil {
			e.opt.ShardOpened(sp.Name, o.path, o.Flushed)
		}
		if sp.Rewrite {
			err = e.rewriteShard(ctx, sp, o)
		} else {
			err = e.copyShard(sp, o)
		}
		if errors.Is(err, errNoResume) && attempt == 0 {
			o.f.Close()
			e.j.dropCheckpoint(sp.Name)
			continue
		}
		if err != nil {
			o.pause()
			return FileDigest{}, err
		}
		return o.commit()
	}
}

// copyShard copies a shard without adapted tensors byte for byte.
func (e *executor) copyShard(sp ShardPlan, o shardSink) error {
	src := filepath.Join(e.p.BaseDir, sp.Name)
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	off := o.Written()
	if off > fi.Size() {
		return errNoResume
	}
	e.advance(off)
	buf := e.copyBuf()
	defer e.putCopyBuf(buf)
	if err := copySection(o, io.NewSectionReader(in, off, fi.Size()-off), e.advance, *buf); err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	return nil
}

// rewriteShard writes one shard holding adapted tensors through a
// safetensors.Writer: same tensors in the same order as the base shard,
// the base's __metadata__, merged tensors computed row block by row block.
// A resumed shard continues at its checkpoint: inside a copied tensor at
// any byte, inside a merged one at a row block, inside a converted
// replacement at a chunk.
func (e *executor) rewriteShard(ctx context.Context, sp ShardPlan, o shardSink) error {
	var sh *safetensors.Shard
	for _, s := range e.p.base.Shards {
		if s.Name == sp.Name {
			sh = s
		}
	}
	specs := make([]safetensors.TensorSpec, len(sp.Tensors))
	for i, t := range sp.Tensors {
		specs[i] = safetensors.TensorSpec{Name: t.Name, DType: t.DType, Shape: t.Shape}
	}
	w, err := safetensors.ResumeWriter(o, filepath.Join(e.out, sp.Name), sh.Metadata, specs, o.Written())
	if err != nil {
		if o.Written() > 0 {
			return errNoResume
		}
		return err
	}
	cur, in := w.Position()
	first := 0 // row blocks of tensor cur already written
	if cur < len(sp.Tensors) && in > 0 {
		t := sp.Tensors[cur]
		switch t.Op {
		case OpCopy:
		case OpMerge:
			m := e.p.Modules[t.Module]
			rowBytes := m.Cols * int64(t.DType.Bits()/8)
			bb := int64(blockRows(e.opt.BlockElems, int(m.Rows), int(m.Cols))) * rowBytes
			if in%bb != 0 {
				return errNoResume
			}
			first = int(in / bb)
		case OpReplace:
			src, _ := e.p.adapter.Tensor(t.Source)
			if src.DType != t.DType && in%(replaceChunk*int64(t.DType.Bits()/8)) != 0 {
				return errNoResume
			}
		default:
			return errNoResume
		}
	}
	e.advance(sh.DataOffset())
	for i, t := range sp.Tensors {
		if err := ctx.Err(); err != nil {
			return err
		}
		info, _ := sh.Tensor(t.Name)
		if i < cur {
			e.advance(info.Size())
			continue
		}
		from := int64(0)
		if i == cur {
			from = in
		}
		switch t.Op {
		case OpCopy:
			e.advance(from)
			buf := e.copyBuf()
			err := copySection(w, io.NewSectionReader(sh.Section(info), from, info.Size()-from), e.advance, *buf)
			e.putCopyBuf(buf)
			if err != nil {
				return fmt.Errorf("%s: tensor %q: %w", sh.Path, t.Name, err)
			}
		case OpMerge:
			blocks := 0
			if i == cur {
				blocks = first
				// Progress counts base bytes: the rows written, at the base's width.
				e.advance(from / int64(t.DType.Bits()/8) * int64(info.DType.Bits()/8))
			}
			if err := e.mergeTensor(ctx, w, sh, info, t, blocks); err != nil {
				return err
			}
		case OpBias:
			if err := e.biasTensor(w, sh, info, t); err != nil {
				return err
			}
		case OpReplace:
			if err := e.replaceTensor(w, info, t, from); err != nil {
				return err
			}
		default:
			return fmt.Errorf("tensor %q: unknown op %q", t.Name, t.Op)
		}
	}
	return w.Close()
}

func copySection(w io.Writer, r io.Reader, advance func(int64), buf []byte) error {
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			advance(int64(n))
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
