package quantize

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/convert"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/safetensors"
)

// Source is what a quantization reads: a GGUF file, or a Hugging Face
// safetensors checkpoint directory read as the F16 GGUF file gguf/convert
// would write from it (convert_hf_to_gguf.py --outtype f16), made tensor
// row by tensor row as the quantizer reads them and never written: the
// header (every KV, every tensor in the converter's order) and the F16
// bytes, rounding included, are the converter's, so the output is the one
// llama-quantize makes of that file.
type Source struct {
	// File is the GGUF header; for a checkpoint that of the F16 file,
	// its reader converting on demand.
	*gguf.File
	// Convert is the checkpoint's conversion plan (nil for a GGUF file).
	Convert *convert.Plan

	ckpt  *safetensors.Checkpoint
	stamp string
}

// SourceOptions say how a checkpoint is converted (ignored for a GGUF
// file): `ferry gguf convert`'s options.
type SourceOptions struct {
	// NoMTP drops the mtp.* tensors (convert --no-mtp).
	NoMTP bool
	// FollowLinks lets shards be symbolic links out of the directory.
	FollowLinks bool
}

// OpenSource opens path: a directory is a checkpoint, anything else a
// GGUF file. The caller closes the Source.
func OpenSource(path string, o SourceOptions) (*Source, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		f, err := gguf.Open(path)
		if err != nil {
			return nil, err
		}
		return &Source{File: f}, nil
	}
	ck, err := safetensors.OpenDirOptions(path, safetensors.DirOptions{FollowExternalLinks: o.FollowLinks})
	if err != nil {
		return nil, err
	}
	cp, err := convert.NewPlan(ck, convert.Options{OutType: convert.OutF16, NoMTP: o.NoMTP})
	if err != nil {
		ck.Close()
		return nil, err
	}
	f, err := gguf.Parse(cp.ReaderAt(), cp.Layout.Size, path)
	if err != nil {
		ck.Close()
		return nil, err
	}
	return &Source{File: f, Convert: cp, ckpt: ck, stamp: convert.Stamp(ck, cp)}, nil
}

// Checkpoint reports whether the source is a checkpoint directory.
func (s *Source) Checkpoint() bool { return s.Convert != nil }

// NewPlan plans the quantization of the source (NewPlan of its file).
func (s *Source) NewPlan(o Options) (*Plan, error) {
	p, err := NewPlan(s.File, o)
	if err != nil {
		return nil, err
	}
	p.inputStamp = s.stamp
	return p, nil
}

// Close closes the file or the checkpoint's shards.
func (s *Source) Close() error {
	if s.ckpt != nil {
		return s.ckpt.Close()
	}
	return s.File.Close()
}

// Stem is the name the source's outputs are named after: a GGUF file's
// name without .gguf (and a split's -00001-of-0000N) and a trailing -F16,
// -BF16 or -F32 (in either case), or a checkpoint directory's name.
func (s *Source) Stem() string { return Stem(s.Path) }

// Stem is Source.Stem for the path of a source. A split's part is named
// after its prefix (base-F16-00001-of-00003.gguf → base).
func Stem(path string) string {
	if prefix, _, _, ok := gguf.ParseSplitName(filepath.Clean(path)); ok {
		path = prefix + ".gguf"
	}
	base := filepath.Base(filepath.Clean(path))
	if strings.HasSuffix(strings.ToLower(base), ".gguf") {
		base = base[:len(base)-len(".gguf")]
		for _, suf := range []string{"-F16", "-BF16", "-F32"} {
			if len(base) > len(suf) && strings.EqualFold(base[len(base)-len(suf):], suf) {
				base = base[:len(base)-len(suf)]
				break
			}
		}
	}
	return base
}

// OutputName is the file name of the ft quantization of a source of stem
// stem: stem-TYPE.gguf (base-Q4_K_M.gguf).
func OutputName(stem string, ft quant.FileType) string {
	return stem + "-" + ft.String() + ".gguf"
}
