package safetensors_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/safetensors"
	. "github.com/ferry-llm/ferry/safetensors/safetensorstest"
	"github.com/ferry-llm/ferry/tensor"
)

const bundled = "../testdata/models/qwen35-tiny"

func TestBadInput(t *testing.T) {
	for _, c := range BadCases() {
		t.Run(c.Name, func(t *testing.T) {
			root := t.TempDir()
			p, err := c.Build(root)
			if err != nil {
				t.Fatal(err)
			}
			before, err := Snapshot(root)
			if err != nil {
				t.Fatal(err)
			}
			if c.Dir {
				var ck *safetensors.Checkpoint
				ck, err = safetensors.OpenDir(p)
				if err == nil {
					ck.Close()
				}
			} else {
				var f *safetensors.File
				f, err = safetensors.Open(p)
				if err == nil {
					f.Close()
				}
			}
			if !errors.Is(err, c.Want) {
				t.Fatalf("error %v, want %v", err, c.Want)
			}
			t.Log(strings.ReplaceAll(err.Error(), root, "ROOT"))
			var se *safetensors.Error
			if !errors.As(err, &se) || !se.BadInput() {
				t.Errorf("error %v is not a *safetensors.Error marked BadInput", err)
			}
			if !strings.Contains(err.Error(), c.Blame) {
				t.Errorf("error %q does not name %s", err, c.Blame)
			}
			after, err := Snapshot(root)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(before, after) {
				t.Errorf("input changed:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

// Each sentinel is used by exactly one case of the table's core, so a
// mis-classified error cannot hide behind another case.
func TestBadInputDistinctErrors(t *testing.T) {
	msgs := map[string]string{}
	for _, c := range BadCases() {
		root := t.TempDir()
		p, err := c.Build(root)
		if err != nil {
			t.Fatal(err)
		}
		if c.Dir {
			_, err = safetensors.OpenDir(p)
		} else {
			_, err = safetensors.Open(p)
		}
		msg := strings.ReplaceAll(err.Error(), root, "ROOT")
		if prev, dup := msgs[msg]; dup {
			t.Errorf("cases %q and %q give the same message %q", prev, c.Name, msg)
		}
		msgs[msg] = c.Name
	}
}

func TestErrorOffsets(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "gap.safetensors")
	hdr := `{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}`
	if err := WriteRaw(p, hdr, make([]byte, 12)); err != nil {
		t.Fatal(err)
	}
	_, err := safetensors.Open(p)
	var se *safetensors.Error
	if !errors.As(err, &se) {
		t.Fatalf("error %v", err)
	}
	padded := int64(len(hdr)+7) / 8 * 8
	if se.Tensor != "b" || se.Offset != 8+padded+8 {
		t.Errorf("tensor %q offset %d, want \"b\" at %d", se.Tensor, se.Offset, 8+padded+8)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf(`tensor "b" at offset %d`, 8+padded+8)) {
		t.Errorf("message %q lacks tensor and offset", err)
	}
}

func TestParseAccepts(t *testing.T) {
	tests := []struct {
		name   string
		header string
		data   int
		n      int
	}{
		{"empty", `{}`, 0, 0},
		{"metadata only", `{"__metadata__":{"format":"pt"}}`, 0, 0},
		{"leading whitespace, as serde_json allows", `  {"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`, 2, 1},
		{"scalar", `{"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}`, 4, 1},
		{"zero-size tensor", `{"z":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 1, 2},
		{"F4 packed", `{"q":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}}`, 2, 1},
		{"unordered keys", `{"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 2, 2},
		{"extra field ignored", `{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}}`, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "f.safetensors")
			if err := WriteRaw(p, tt.header, make([]byte, tt.data)); err != nil {
				t.Fatal(err)
			}
			f, err := safetensors.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if len(f.Tensors) != tt.n {
				t.Errorf("%d tensors, want %d", len(f.Tensors), tt.n)
			}
			for i := 1; i < len(f.Tensors); i++ {
				if f.Tensors[i].Begin < f.Tensors[i-1].End {
					t.Errorf("tensors not in offset order: %v", f.Tensors)
				}
			}
		})
	}
}

func TestParseRejectsMore(t *testing.T) {
	tests := []struct {
		name   string
		header string
		data   int
		want   error
	}{
		{"not an object", `[1,2]`, 0, safetensors.ErrInvalidHeader},
		{"not UTF-8", "{\"a\xff\":{}}", 0, safetensors.ErrInvalidHeader},
		{"metadata not strings", `{"__metadata__":{"a":1}}`, 0, safetensors.ErrInvalidHeader},
		{"metadata twice", `{"__metadata__":{},"__metadata__":{}}`, 0, safetensors.ErrInvalidHeader},
		// encoding/json would read these nulls as "" and 0; serde rejects them.
		{"null metadata value", `{"__metadata__":{"format":null}}`, 0, safetensors.ErrInvalidHeader},
		{"null dimension", `{"a":{"dtype":"U8","shape":[null],"data_offsets":[0,0]}}`, 0, safetensors.ErrInvalidHeader},
		{"null offset", `{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,null]}}`, 0, safetensors.ErrInvalidOffset},
		{"field twice in an entry", `{"a":{"dtype":"F32","dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 1, safetensors.ErrInvalidHeader},
		{"field name in another case", `{"a":{"DType":"U8","shape":[1],"data_offsets":[0,1]}}`, 1, safetensors.ErrInvalidHeader},
		{"entry not an object", `{"a":[1]}`, 0, safetensors.ErrInvalidHeader},
		{"null dtype", `{"a":{"dtype":null,"shape":[0],"data_offsets":[0,0]}}`, 0, safetensors.ErrInvalidHeader},
		{"missing shape", `{"a":{"dtype":"U8","data_offsets":[0,1]}}`, 1, safetensors.ErrInvalidHeader},
		{"negative dim", `{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}`, 1, safetensors.ErrInvalidHeader},
		{"three offsets", `{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}`, 1, safetensors.ErrInvalidOffset},
		{"end before begin", `{"a":{"dtype":"U8","shape":[1],"data_offsets":[1,0]}}`, 1, safetensors.ErrInvalidOffset},
		{"not starting at 0", `{"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, 2, safetensors.ErrGap},
		{"element count overflows", `{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`, 0, safetensors.ErrSizeMismatch},
		{"F4 odd count", `{"q":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}`, 2, safetensors.ErrSizeMismatch},
		{"data after the object", `{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}} x`, 1, safetensors.ErrInvalidHeader},
		{"data past the end", `{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}`, 4, safetensors.ErrTruncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "f.safetensors")
			if err := WriteRaw(p, tt.header, make([]byte, tt.data)); err != nil {
				t.Fatal(err)
			}
			_, err := safetensors.Open(p)
			if !errors.Is(err, tt.want) {
				t.Errorf("error %v, want %v", err, tt.want)
			}
		})
	}
}

func TestOpenBundled(t *testing.T) {
	ck, err := safetensors.OpenDir(filepath.Join(bundled, "base"))
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if n := len(ck.Tensors()); n != 71 {
		t.Errorf("%d tensors, want 71", n)
	}
	if n := len(ck.Shards); n != 7 {
		t.Errorf("%d shards, want 7", n)
	}
	if a := ck.Config.Architecture(); a != "Qwen3_5ForCausalLM" {
		t.Errorf("architecture %q", a)
	}
	if n := ck.Config.MTPLayers(); n != 1 {
		t.Errorf("MTPLayers %d, want 1", n)
	}
	var total int64
	for _, l := range ck.Tensors() {
		n, err := io.Copy(io.Discard, l.Section())
		if err != nil || n != l.Info.Size() {
			t.Fatalf("%s: read %d of %d: %v", l.Info.Name, n, l.Info.Size(), err)
		}
		total += n
	}
	if ts := ck.Index.Metadata["total_size"]; fmt.Sprint(ts) != fmt.Sprint(total) {
		t.Errorf("index total_size %v, tensors sum to %d", ts, total)
	}
	if l, ok := ck.Lookup("mtp.fc.weight"); !ok || l.Shard.Name != "model-00007-of-00007.safetensors" || !reflect.DeepEqual(l.Info.Shape, []int64{256, 512}) {
		t.Errorf("mtp.fc.weight: %+v %v", l, ok)
	}
}

// referenceHeaders yields (name, header bytes) for every golden header:
// the cut headers in testdata/reference and the bundled example's files.
func referenceHeaders(t *testing.T) map[string][]byte {
	out := map[string][]byte{}
	cut, _ := filepath.Glob("testdata/reference/*.header")
	for _, p := range cut {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out[p] = b
	}
	whole, _ := filepath.Glob(filepath.Join(bundled, "*", "*.safetensors"))
	for _, p := range whole {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		var n uint64
		if err := binary.Read(f, binary.LittleEndian, &n); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 8+n)
		if _, err := f.ReadAt(b, 0); err != nil {
			t.Fatal(err)
		}
		f.Close()
		out[p] = b
	}
	if len(out) < 12 {
		t.Fatalf("only %d reference headers found", len(out))
	}
	return out
}

// parseHeaderOnly parses a header without its data by presenting a reader
// that is zero past the header, of the length the header declares.
func parseHeaderOnly(t *testing.T, name string, hdr []byte) *safetensors.File {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(hdr[8:], &raw); err != nil {
		t.Fatal(err)
	}
	var end int64
	for k, v := range raw {
		if k == "__metadata__" {
			continue
		}
		var e struct{ Data_offsets [2]int64 }
		json.Unmarshal(v, &e)
		end = max(end, e.Data_offsets[1])
	}
	f, err := safetensors.Parse(zeroPadded(hdr), int64(len(hdr))+end, name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

type zeroPadded []byte

func (z zeroPadded) ReadAt(p []byte, off int64) (int, error) {
	for i := range p {
		if o := off + int64(i); o < int64(len(z)) {
			p[i] = z[o]
		} else {
			p[i] = 0
		}
	}
	return len(p), nil
}

// EncodeHeader reproduces, byte for byte, the headers safetensors 0.8.0
// wrote, and SortReference reproduces its tensor order.
func TestEncodeHeaderMatchesReference(t *testing.T) {
	for name, hdr := range referenceHeaders(t) {
		f := parseHeaderOnly(t, name, hdr)
		specs := make([]safetensors.TensorSpec, len(f.Tensors))
		for i, ti := range f.Tensors {
			specs[i] = safetensors.TensorSpec{Name: ti.Name, DType: ti.DType, Shape: ti.Shape}
		}
		got, _, err := safetensors.EncodeHeader(f.Metadata, specs)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, hdr) {
			t.Errorf("%s: EncodeHeader differs from the reference writer\n got %q\nwant %q", name, got, hdr)
		}
		shuffled := append([]safetensors.TensorSpec(nil), specs...)
		rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		safetensors.SortReference(shuffled)
		if !reflect.DeepEqual(shuffled, specs) {
			t.Errorf("%s: SortReference does not reproduce the reference order", name)
		}
	}
}

func TestWriteIndexMatchesReference(t *testing.T) {
	for _, name := range []string{"qwen3-base.index.json", "qwen35-base.index.json"} {
		want, err := os.ReadFile(filepath.Join("testdata/reference", name))
		if err != nil {
			t.Fatal(err)
		}
		idx, err := safetensors.ParseIndex(want, name)
		if err != nil {
			t.Fatal(err)
		}
		var total int64
		fmt.Sscan(fmt.Sprint(idx.Metadata["total_size"]), &total)
		var params int64
		fmt.Sscan(fmt.Sprint(idx.Metadata["total_parameters"]), &params)
		dir := t.TempDir()
		if err := safetensors.WriteIndex(dir, idx.WeightMap, total, map[string]any{"total_parameters": params}); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dir, safetensors.IndexName))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: WriteIndex output differs\n got %s\nwant %s", name, got, want)
		}
	}
}

func TestWriterRoundTrip(t *testing.T) {
	specs := []safetensors.TensorSpec{
		Spec("a<b>&c", tensor.BF16, 3, 5), // odd size: the header must pad
		Spec("empty", tensor.F32, 0, 7),
		Spec("scalar", tensor.F32),
		Spec("ünïcode", tensor.U8, 3),
		Spec("empty2", tensor.I64, 0),
		Spec("big", tensor.F16, 1000, 3),
		Spec("tail-empty", tensor.BF16, 4, 0),
	}
	for _, mode := range []string{"WriteTensor", "Write in odd chunks"} {
		t.Run(mode, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "out.safetensors")
			w, err := safetensors.Create(p, map[string]string{"format": "pt", "k<&>": "v"}, specs)
			if err != nil {
				t.Fatal(err)
			}
			if mode == "WriteTensor" {
				for _, s := range specs {
					if err := w.WriteTensor(s.Name, bytes.NewReader(Fill(s.Name, s.Size()))); err != nil {
						t.Fatal(err)
					}
				}
			} else {
				var all []byte
				for _, s := range specs {
					all = append(all, Fill(s.Name, s.Size())...)
				}
				for len(all) > 0 {
					n := min(len(all), 7)
					if _, err := w.Write(all[:n]); err != nil {
						t.Fatal(err)
					}
					all = all[n:]
				}
			}
			if !w.Done() {
				t.Error("Done false after all bytes")
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			n := binary.LittleEndian.Uint64(raw)
			if (8+n)%8 != 0 {
				t.Errorf("header length %d: data not 8-aligned", n)
			}
			hdr := string(raw[8 : 8+n])
			if trimmed := strings.TrimRight(hdr, " "); !strings.HasSuffix(trimmed, "}") || len(hdr)-len(trimmed) > 7 {
				t.Errorf("header padding: %q", hdr[len(hdr)-10:])
			}
			if !strings.Contains(hdr, `"a<b>&c"`) || !strings.Contains(hdr, `"ünïcode"`) {
				t.Errorf("names escaped unlike serde_json: %s", hdr)
			}
			f, err := safetensors.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.Metadata["k<&>"] != "v" || len(f.Tensors) != len(specs) {
				t.Fatalf("metadata %v, %d tensors", f.Metadata, len(f.Tensors))
			}
			for _, s := range specs {
				ti, ok := f.Tensor(s.Name)
				if !ok {
					t.Fatalf("%s missing", s.Name)
				}
				got, _ := io.ReadAll(f.Section(ti))
				if !bytes.Equal(got, Fill(s.Name, s.Size())) || ti.DType != s.DType {
					t.Errorf("%s: bytes or dtype differ", s.Name)
				}
			}
			if st, _ := os.Stat(p); st.Mode().Perm() != 0o644 {
				t.Errorf("mode %v, want 0644", st.Mode())
			}
		})
	}
}

func partials(t *testing.T, dir string) []string {
	m, _ := filepath.Glob(filepath.Join(dir, "*.partial"))
	return m
}

func TestWriterErrors(t *testing.T) {
	specs := []safetensors.TensorSpec{Spec("a", tensor.U8, 4), Spec("b", tensor.U8, 4)}
	tests := []struct {
		name string
		do   func(w *safetensors.Writer) error
		want error
	}{
		{"out of order", func(w *safetensors.Writer) error { return w.WriteTensor("b", bytes.NewReader(make([]byte, 4))) }, safetensors.ErrWriteOrder},
		{"too many bytes", func(w *safetensors.Writer) error { _, err := w.Write(make([]byte, 9)); return err }, safetensors.ErrWriteSize},
		{"short reader", func(w *safetensors.Writer) error { return w.WriteTensor("a", bytes.NewReader(make([]byte, 3))) }, io.EOF},
		{"close incomplete", func(w *safetensors.Writer) error { w.Write(make([]byte, 5)); return w.Close() }, safetensors.ErrWriteSize},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "out.safetensors")
			w, err := safetensors.Create(p, nil, specs)
			if err != nil {
				t.Fatal(err)
			}
			if err := tt.do(w); !errors.Is(err, tt.want) {
				t.Fatalf("error %v, want %v", err, tt.want)
			}
			if err := w.Close(); err == nil {
				t.Fatal("Close succeeded after an error")
			}
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("file exists under its final name after a failed write")
			}
			if left := partials(t, dir); len(left) != 0 {
				t.Errorf("temp files left: %v", left)
			}
		})
	}
	if _, err := safetensors.Create(filepath.Join(t.TempDir(), "x"), nil, []safetensors.TensorSpec{Spec("a", tensor.U8, 1), Spec("a", tensor.U8, 1)}); !errors.Is(err, safetensors.ErrDuplicateTensor) {
		t.Errorf("duplicate spec: %v", err)
	}
}

func TestWriterAbortAndNeverClosed(t *testing.T) {
	dir := t.TempDir()
	specs := []safetensors.TensorSpec{Spec("a", tensor.U8, 1<<20)}
	p := filepath.Join(dir, "aborted.safetensors")
	w, err := safetensors.Create(p, nil, specs)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(make([]byte, 1<<19))
	w.Abort()
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Error("aborted file exists under its final name")
	}
	if left := partials(t, dir); len(left) != 0 {
		t.Errorf("temp files left after Abort: %v", left)
	}

	q := filepath.Join(dir, "open.safetensors")
	w, err = safetensors.Create(q, nil, specs)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(make([]byte, 1<<20)) // every byte, but never closed
	if _, err := os.Stat(q); !os.IsNotExist(err) {
		t.Error("unclosed file exists under its final name")
	}
	if left := partials(t, dir); len(left) != 1 || !strings.HasPrefix(filepath.Base(left[0]), ".open.safetensors.") {
		t.Errorf("temp files: %v", left)
	}
	w.Abort()
}

// The child half of TestKilledWriter: write part of a file, say so, hang.
func init() {
	p := os.Getenv("FERRY_TEST_KILLED_WRITER")
	if p == "" {
		return
	}
	w, err := safetensors.Create(p, nil, []safetensors.TensorSpec{Spec("a", tensor.U8, 64<<20)})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	w.Write(make([]byte, 16<<20)) // past the 1 MiB buffer: bytes reach the temp file
	fmt.Println("ready")
	time.Sleep(time.Minute)
	os.Exit(1)
}

func TestKilledWriter(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "killed.safetensors")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "FERRY_TEST_KILLED_WRITER="+p)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "ready\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child said %q", line)
	}
	left := partials(t, dir)
	if len(left) != 1 {
		t.Errorf("no temp file while writing: %v", left)
	} else if st, err := os.Stat(left[0]); err != nil || st.Size() < 1<<20 {
		t.Errorf("temp file has %v bytes, want the child's writes to have landed", st.Size())
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Error("file exists under its final name after SIGKILL mid-write")
	}
	if _, err := safetensors.OpenDir(dir); err == nil {
		t.Error("the killed write's directory opens as a checkpoint")
	}
}

func TestPlanShards(t *testing.T) {
	u8 := func(name string, n int64) safetensors.TensorSpec { return Spec(name, tensor.U8, n) }
	names := func(plan [][]safetensors.TensorSpec) [][]string {
		var out [][]string
		for _, s := range plan {
			var n []string
			for _, t := range s {
				n = append(n, t.Name)
			}
			out = append(out, n)
		}
		return out
	}
	// huggingface_hub's own test vector (tests/test_serialization.py,
	// DUMMY_STATE_DICT with max_shard_size 10 and 100).
	hub := []safetensors.TensorSpec{u8("layer_1", 6), u8("layer_2", 10), u8("layer_3", 30), u8("layer_4", 2), u8("layer_5", 2)}
	tests := []struct {
		name  string
		specs []safetensors.TensorSpec
		max   int64
		want  [][]string
	}{
		{"hub multiple shards", hub, 10, [][]string{{"layer_1"}, {"layer_3"}, {"layer_2"}, {"layer_4", "layer_5"}}},
		{"hub single shard", hub, 100, [][]string{{"layer_1", "layer_2", "layer_3", "layer_4", "layer_5"}}},
		{"exactly full", []safetensors.TensorSpec{u8("a", 5), u8("b", 5), u8("c", 1)}, 10, [][]string{{"a", "b"}, {"c"}}},
		{"oversized first", []safetensors.TensorSpec{u8("big", 11), u8("a", 3)}, 10, [][]string{{"big"}, {"a"}}},
		{"empty", nil, 10, [][]string{nil}},
	}
	for _, tt := range tests {
		if got := names(safetensors.PlanShards(tt.specs, tt.max)); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestShardedWriter(t *testing.T) {
	specs := []safetensors.TensorSpec{
		Spec("a", tensor.U8, 6), Spec("b", tensor.U8, 10), Spec("zero", tensor.U8, 0),
		Spec("c", tensor.U8, 30), Spec("d", tensor.U8, 2), Spec("e", tensor.U8, 2),
	}
	t.Run("sharded", func(t *testing.T) {
		dir := t.TempDir()
		sw, err := safetensors.CreateSharded(dir, map[string]string{"format": "pt"}, specs, 10, map[string]any{"total_parameters": 50})
		if err != nil {
			t.Fatal(err)
		}
		var wantFiles []string
		for _, f := range sw.Files() {
			wantFiles = append(wantFiles, f.Name)
		}
		if !reflect.DeepEqual(wantFiles, []string{safetensors.ShardName(1, 4), safetensors.ShardName(2, 4), safetensors.ShardName(3, 4), safetensors.ShardName(4, 4)}) {
			t.Fatalf("files %v", wantFiles)
		}
		// Tensors in plan order (not spec order: c's shard comes before b's).
		for _, f := range sw.Files() {
			for _, s := range f.Tensors {
				if err := sw.WriteTensor(s.Name, bytes.NewReader(Fill(s.Name, s.Size()))); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := sw.Close(); err != nil {
			t.Fatal(err)
		}
		ck, err := safetensors.OpenDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer ck.Close()
		if len(ck.Shards) != 4 || len(ck.Tensors()) != len(specs) {
			t.Fatalf("%d shards, %d tensors", len(ck.Shards), len(ck.Tensors()))
		}
		for _, s := range specs {
			l, ok := ck.Lookup(s.Name)
			if !ok {
				t.Fatalf("%s missing", s.Name)
			}
			got, _ := io.ReadAll(l.Section())
			if !bytes.Equal(got, Fill(s.Name, s.Size())) {
				t.Errorf("%s: bytes differ", s.Name)
			}
		}
		if l, _ := ck.Lookup("c"); l.Shard.Name != safetensors.ShardName(2, 4) {
			t.Errorf("c in %s, want its own shard 2", l.Shard.Name)
		}
		if fmt.Sprint(ck.Index.Metadata["total_size"]) != "50" || fmt.Sprint(ck.Index.Metadata["total_parameters"]) != "50" {
			t.Errorf("index metadata %v", ck.Index.Metadata)
		}
	})
	t.Run("single shard", func(t *testing.T) {
		dir := t.TempDir()
		sw, err := safetensors.CreateSharded(dir, nil, specs, 1<<20, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range specs {
			if err := sw.WriteTensor(s.Name, bytes.NewReader(Fill(s.Name, s.Size()))); err != nil {
				t.Fatal(err)
			}
		}
		if err := sw.Close(); err != nil {
			t.Fatal(err)
		}
		ents, _ := os.ReadDir(dir)
		if len(ents) != 1 || ents[0].Name() != safetensors.SingleName {
			t.Fatalf("directory holds %v, want only model.safetensors", ents)
		}
		ck, err := safetensors.OpenDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		ck.Close()
	})
	t.Run("aborted", func(t *testing.T) {
		dir := t.TempDir()
		sw, err := safetensors.CreateSharded(dir, nil, specs, 10, nil)
		if err != nil {
			t.Fatal(err)
		}
		first := sw.Files()[0].Tensors[0]
		sw.WriteTensor(first.Name, bytes.NewReader(Fill(first.Name, first.Size())))
		sw.Abort()
		if _, err := os.Stat(filepath.Join(dir, safetensors.IndexName)); !os.IsNotExist(err) {
			t.Error("index written by an aborted sharded writer")
		}
		if _, err := safetensors.OpenDir(dir); err == nil {
			t.Error("aborted output opens as a checkpoint")
		}
	})
}

func TestSymlinks(t *testing.T) {
	shard2 := Shards[1].Name
	t.Run("inside the directory", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "ckpt")
		if err := WriteCheckpoint(dir); err != nil {
			t.Fatal(err)
		}
		os.Mkdir(filepath.Join(dir, "sub"), 0o755)
		os.Rename(filepath.Join(dir, shard2), filepath.Join(dir, "sub", "x"))
		os.Symlink(filepath.Join("sub", "x"), filepath.Join(dir, shard2))
		ck, err := safetensors.OpenDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		ck.Close()
	})
	t.Run("into a blob store", func(t *testing.T) {
		root := t.TempDir()
		dir := filepath.Join(root, "ckpt")
		if err := WriteCheckpoint(dir); err != nil {
			t.Fatal(err)
		}
		blob := filepath.Join(root, "store", "blobs", strings.Repeat("ab", 32))
		os.MkdirAll(filepath.Dir(blob), 0o755)
		os.Rename(filepath.Join(dir, shard2), blob)
		os.Symlink(blob, filepath.Join(dir, shard2))
		ck, err := safetensors.OpenDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		ck.Close()
	})
	t.Run("outside, followed on request", func(t *testing.T) {
		var c BadCase
		for _, b := range BadCases() {
			if b.Want == safetensors.ErrSymlinkOutside {
				c = b
			}
		}
		dir, err := c.Build(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		ck, err := safetensors.OpenDirOptions(dir, safetensors.DirOptions{FollowExternalLinks: true})
		if err != nil {
			t.Fatal(err)
		}
		ck.Close()
	})
	t.Run("a directory named blobs is not enough", func(t *testing.T) {
		root := t.TempDir()
		dir := filepath.Join(root, "ckpt")
		WriteCheckpoint(dir)
		evil := filepath.Join(root, "blobs", "weights.safetensors")
		os.MkdirAll(filepath.Dir(evil), 0o755)
		os.Rename(filepath.Join(dir, shard2), evil)
		os.Symlink(evil, filepath.Join(dir, shard2))
		if _, err := safetensors.OpenDir(dir); !errors.Is(err, safetensors.ErrSymlinkOutside) {
			t.Errorf("error %v, want ErrSymlinkOutside", err)
		}
	})
}

func TestConfig(t *testing.T) {
	c, err := safetensors.ParseConfig([]byte(`{"architectures":["Qwen3_5ForConditionalGeneration"],"model_type":"qwen3_5",
		"text_config":{"model_type":"qwen3_5_text","hidden_size":256,"num_nextn_predict_layers":2,"rms_norm_eps":1e-6,"name":"x","tie":true}}`), "config.json")
	if err != nil {
		t.Fatal(err)
	}
	if c.Architecture() != "Qwen3_5ForConditionalGeneration" || c.ModelType != "qwen3_5" {
		t.Errorf("%q %q", c.Architecture(), c.ModelType)
	}
	if n, ok := c.Int("hidden_size"); !ok || n != 256 {
		t.Errorf("hidden_size %d %v", n, ok)
	}
	if f, ok := c.Float("rms_norm_eps"); !ok || f != 1e-6 {
		t.Errorf("rms_norm_eps %g", f)
	}
	if s, _ := c.String("name"); s != "x" {
		t.Errorf("name %q", s)
	}
	if b, _ := c.Bool("tie"); !b {
		t.Error("tie")
	}
	if c.MTPLayers() != 2 {
		t.Errorf("MTPLayers %d", c.MTPLayers())
	}
	for _, bad := range []string{`[1]`, `null`, `{"a":1} {"b":2}`, `{"a":1`, ``} {
		if _, err := safetensors.ParseConfig([]byte(bad), "config.json"); !errors.Is(err, safetensors.ErrInvalidConfig) || !strings.Contains(err.Error(), "config.json") {
			t.Errorf("bad config %q: %v", bad, err)
		}
	}
	if _, err := safetensors.ParseConfig([]byte("{\"a\":1}\n"), "config.json"); err != nil {
		t.Errorf("config with a trailing newline: %v", err)
	}
	// A float beyond float64's range (Python reads it as inf and writes
	// Infinity back, which no JSON reader takes) is refused, named; a
	// long integer is not a float.
	for in, where := range map[string]string{
		`{"rope_parameters":{"rope_theta":5e999}}`: "rope_parameters.rope_theta: the number 5e999",
		`{"a":[1.0,-1.5e400]}`:                     "a[1]: the number -1.5e400",
	} {
		if _, err := safetensors.ParseConfig([]byte(in), "config.json"); !errors.Is(err, safetensors.ErrInvalidConfig) || !strings.Contains(err.Error(), where) || !strings.Contains(err.Error(), "config.json") {
			t.Errorf("%s: %v", in, err)
		}
	}
	if _, err := safetensors.ParseConfig([]byte(`{"big":123456789012345678901234567890,"small":1e-400}`), "config.json"); err != nil {
		t.Errorf("a long integer, a float that rounds to 0: %v", err)
	}
}

// Tensor names are escaped as serde_json escapes them, and read back
// unchanged.
func TestHeaderStringEscaping(t *testing.T) {
	tests := []struct{ name, want string }{
		{"plain.weight", `"plain.weight"`},
		{`q"uote\back`, `"q\"uote\\back"`},
		{"tab\tnl\ncr\rbs\bff\f", `"tab\tnl\ncr\rbs\bff\f"`},
		{"ctl\x00\x1f\x7f", `"ctl\u0000\u001f` + "\x7f" + `"`},
		{"html<>&", `"html<>&"`},
		{"line\u2028para\u2029", "\"line\u2028para\u2029\""},
		{"ünï😀", `"ünï😀"`},
	}
	for _, tt := range tests {
		hdr, _, err := safetensors.EncodeHeader(nil, []safetensors.TensorSpec{Spec(tt.name, tensor.U8, 1)})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(hdr, []byte(tt.want+`:{"dtype"`)) {
			t.Errorf("%q encoded as %s, want %s", tt.name, hdr[8:], tt.want)
		}
		f, err := safetensors.Parse(bytes.NewReader(append(hdr, 0)), int64(len(hdr)+1), "x")
		if err != nil {
			t.Fatalf("%q: %v", tt.name, err)
		}
		if f.Tensors[0].Name != tt.name {
			t.Errorf("read back %q, want %q", f.Tensors[0].Name, tt.name)
		}
	}
}

// recorder is a ReaderAt that remembers every byte range read.
type recorder struct {
	r     io.ReaderAt
	reads [][2]int64
}

func (r *recorder) ReadAt(p []byte, off int64) (int, error) {
	r.reads = append(r.reads, [2]int64{off, off + int64(len(p))})
	return r.r.ReadAt(p, off)
}

// Parse reads only the header; a tensor's section reads only its bytes.
func TestSectionsStayInTheirTensor(t *testing.T) {
	p := filepath.Join(bundled, "base", "model-00007-of-00007.safetensors")
	fh, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	st, _ := fh.Stat()
	rec := &recorder{r: fh}
	f, err := safetensors.Parse(rec, st.Size(), p)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rec.reads {
		if r[1] > f.DataOffset() {
			t.Fatalf("Parse read %v, past the header (data starts at %d)", r, f.DataOffset())
		}
	}
	for _, ti := range f.Tensors {
		rec.reads = nil
		if _, err := io.Copy(io.Discard, f.Section(ti)); err != nil {
			t.Fatal(err)
		}
		lo, hi := f.DataOffset()+ti.Begin, f.DataOffset()+ti.End
		for _, r := range rec.reads {
			if r[0] < lo || r[1] > hi {
				t.Fatalf("%s [%d, %d): read %v", ti.Name, lo, hi, r)
			}
		}
	}
}

func TestParseIndexRejects(t *testing.T) {
	for _, tt := range []struct{ name, json string }{
		{"null file name", `{"weight_map":{"a":null}}`},
		{"number as file name", `{"weight_map":{"a":1}}`},
		{"tensor twice", `{"weight_map":{"a":"x.safetensors","a":"y.safetensors"}}`},
		{"weight_map twice", `{"weight_map":{},"weight_map":{}}`},
		{"no weight_map", `{"metadata":{}}`},
		{"weight_map not an object", `{"weight_map":[]}`},
		{"trailing data", `{"weight_map":{}} {}`},
		{"not an object", `[]`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := safetensors.ParseIndex([]byte(tt.json), "idx.json")
			var se *safetensors.Error
			if !errors.Is(err, safetensors.ErrInvalidIndex) || !errors.As(err, &se) || !strings.Contains(err.Error(), "idx.json") {
				t.Errorf("error %v, want ErrInvalidIndex naming idx.json", err)
			}
		})
	}
	if idx, err := safetensors.ParseIndex([]byte(`{"metadata":{"total_size":4},"weight_map":{"a":"x.safetensors"},"extra":[1]}`), "idx.json"); err != nil || idx.WeightMap["a"] != "x.safetensors" {
		t.Errorf("valid index: %v %v", idx, err)
	}
}
