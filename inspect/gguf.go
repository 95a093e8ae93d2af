package inspect

import (
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/verify"
)

// ggufReport reads only the header: the KV table with value types and the
// tensor table (ggml type, ggml dims ne0 first, bytes, absolute offset).
// The first part of a split reports the whole model (gguf.Open): every
// part is a shard, each tensor names its part and its offset there, and
// the KVs are the model's, without the split.* keys.
func ggufReport(path string) (*Report, []hashing.Section, func(), error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, nil, nil, err
	}
	rep := &Report{GGUF: &GGUF{Version: f.Version, Align: f.Alignment, DataOff: f.DataOffset}}
	s := &rep.Summary
	s.Path, s.Format, s.Architecture = path, "gguf", f.Architecture()
	s.Tensors, s.Shards = len(f.Tensors), len(f.Files())
	for _, p := range f.Files() { // a split's parts, the first first
		s.ShardFiles = append(s.ShardFiles, filepath.Base(p))
	}
	s.BytesPerDType = map[string]int64{}
	for _, kv := range f.KVs {
		rep.Metadata = append(rep.Metadata, kvRow(kv))
	}
	sections := make([]hashing.Section, len(f.Tensors))
	for i, t := range f.Tensors {
		shape := make([]int64, len(t.Dims))
		for j, d := range t.Dims {
			shape[j] = int64(d)
		}
		file, off := f.Locate(t) // a split's part, and the offset there
		rep.Tensors = append(rep.Tensors, Row{
			Name: t.Name, DType: t.Type.String(), Shape: shape, Bytes: t.Size(),
			Shard: filepath.Base(file), Offset: off,
		})
		sections[i] = f.Section(t)
		s.Parameters += int64(t.NumElements())
		s.Bytes += t.Size()
		s.BytesPerDType[t.Type.String()] += t.Size()
	}
	s.ParameterRule = verify.RuleElements
	s.MTP = verify.FindGGUFHead(f)
	if mm, ok := f.MMProj(); ok {
		s.MMProj = &mm
	}
	return rep, sections, func() { f.Close() }, nil
}

func kvRow(kv gguf.KV) KV {
	r := KV{Key: kv.Key, Type: kv.Type.String(), Value: kv.Value}
	if a, ok := kv.Value.(gguf.Array); ok {
		r.Type = "ARRAY[" + a.Elem.String() + "]"
		r.Value = a.Values
	}
	return r
}

// writeGGUFMetadata prints the KV table; long arrays show their length and
// first elements.
func (rep *Report) writeGGUFMetadata(w io.Writer) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "\ngguf version %d, alignment %d, data offset %d\n\n", rep.Version, rep.Align, rep.DataOff)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tTYPE\tVALUE")
	for _, r := range rep.Metadata {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Key, r.Type, formatKVValue(r.Value))
	}
	tw.Flush()
	_, err := w.Write(b.Bytes())
	return err
}

func formatKVValue(v any) string {
	const maxShown = 8
	switch x := v.(type) {
	case string:
		q := strconv.Quote(x)
		if len(q) > 120 {
			q = q[:117] + "..."
		}
		return q
	case []string:
		parts := make([]string, 0, maxShown)
		for i, s := range x {
			if i == maxShown {
				break
			}
			parts = append(parts, strconv.Quote(s))
		}
		return fmt.Sprintf("[%d] %s%s", len(x), strings.Join(parts, " "), ellipsis(len(x) > maxShown))
	}
	s := fmt.Sprint(v)
	if strings.HasPrefix(s, "[") {
		n := strings.Count(s, " ") + 1
		if s == "[]" {
			n = 0
		}
		f := strings.Fields(strings.Trim(s, "[]"))
		if len(f) > maxShown {
			f = f[:maxShown]
		}
		return fmt.Sprintf("[%d] %s%s", n, strings.Join(f, " "), ellipsis(n > maxShown))
	}
	return s
}

func ellipsis(b bool) string {
	if b {
		return " …"
	}
	return ""
}
