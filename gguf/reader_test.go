package gguf

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf/quant"
)

// pyDump is the shape of the gguf-py GGUFReader summaries in testdata
// (see testdata/PROVENANCE.md).
type pyDump struct {
	Size     int64          `json:"size"`
	Version  uint32         `json:"version"`
	NTensors int            `json:"n_tensors"`
	Metadata map[string]any `json:"metadata"`
	Tensors  []struct {
		Name   string   `json:"name"`
		Type   string   `json:"type"`
		Shape  []uint64 `json:"shape"`
		NBytes int64    `json:"n_bytes"`
	} `json:"tensors"`
}

// TestParseLlamaCppFile parses a file written by llama-quantize and checks
// every KV and tensor against gguf-py's independent reading of it.
func TestParseLlamaCppFile(t *testing.T) {
	f, err := Open("testdata/qwen3-base-Q8_0.gguf")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	raw, err := os.ReadFile("testdata/qwen3-base-Q8_0.gguf-py.json")
	if err != nil {
		t.Fatal(err)
	}
	var py pyDump
	if err := json.Unmarshal(raw, &py); err != nil {
		t.Fatal(err)
	}
	if f.Size != py.Size || f.Version != py.Version || len(f.Tensors) != py.NTensors {
		t.Fatalf("size/version/count %d/%d/%d, gguf-py %d/%d/%d", f.Size, f.Version, len(f.Tensors), py.Size, py.Version, py.NTensors)
	}
	if len(f.KVs) != len(py.Metadata) {
		t.Errorf("%d KVs, gguf-py lists %d", len(f.KVs), len(py.Metadata))
	}
	for _, kv := range f.KVs {
		want, ok := py.Metadata[kv.Key]
		if !ok {
			t.Errorf("key %q not in gguf-py dump", kv.Key)
			continue
		}
		if err := matchPy(kv.Value, want); err != nil {
			t.Errorf("key %q (%s): %v", kv.Key, kv.Type, err)
		}
	}
	for i, pt := range py.Tensors {
		ti := f.Tensors[i]
		if ti.Name != pt.Name || ti.Type.String() != pt.Type || !reflect.DeepEqual(ti.Dims, pt.Shape) || ti.Size() != pt.NBytes {
			t.Errorf("tensor %d: %s %s %v %d, gguf-py %s %s %v %d", i, ti.Name, ti.Type, ti.Dims, ti.Size(), pt.Name, pt.Type, pt.Shape, pt.NBytes)
		}
	}
	if f.Architecture() != "qwen3" {
		t.Errorf("architecture %q", f.Architecture())
	}
	last := f.Tensors[len(f.Tensors)-1]
	if end := f.DataOffset + int64(last.Offset) + last.Size(); end > f.Size || f.Size-end >= int64(f.Alignment) {
		t.Errorf("last tensor ends at %d, file %d", end, f.Size)
	}
	if f.HeaderRead > 64<<10 {
		t.Errorf("read %d header bytes", f.HeaderRead)
	}
	// A tensor section reads exactly its bytes.
	emb, _ := f.Tensor("token_embd.weight")
	n, err := f.Section(emb).Read(make([]byte, emb.Size()+10))
	if err != nil || int64(n) != emb.Size() {
		t.Errorf("section read %d, %v", n, err)
	}
}

// matchPy compares a decoded value with gguf-py's JSON (floats as float64,
// long arrays abbreviated to first/last).
func matchPy(got, want any) error {
	switch w := want.(type) {
	case map[string]any:
		arr, ok := got.(Array)
		if !ok {
			return fmt.Errorf("got %T, want an array", got)
		}
		vals := reflect.ValueOf(arr.Values)
		if float64(vals.Len()) != w["array_len"].(float64) {
			return fmt.Errorf("array length %d, want %v", vals.Len(), w["array_len"])
		}
		first := w["first"].([]any)
		for i, x := range first {
			if err := matchPy(vals.Index(i).Interface(), x); err != nil {
				return fmt.Errorf("[%d]: %v", i, err)
			}
		}
		last := w["last"].([]any)
		for i, x := range last {
			j := vals.Len() - len(last) + i
			if err := matchPy(vals.Index(j).Interface(), x); err != nil {
				return fmt.Errorf("[%d]: %v", j, err)
			}
		}
		return nil
	case []any:
		arr, ok := got.(Array)
		if !ok {
			return fmt.Errorf("got %T, want an array", got)
		}
		vals := reflect.ValueOf(arr.Values)
		if vals.Len() != len(w) {
			return fmt.Errorf("array length %d, want %d", vals.Len(), len(w))
		}
		for i, x := range w {
			if err := matchPy(vals.Index(i).Interface(), x); err != nil {
				return fmt.Errorf("[%d]: %v", i, err)
			}
		}
		return nil
	case string, bool:
		if got != want {
			return fmt.Errorf("got %v, want %v", got, want)
		}
		return nil
	case float64:
		g := reflect.ValueOf(got)
		var gf float64
		switch g.Kind() {
		case reflect.Float32, reflect.Float64:
			gf = g.Float()
		case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			gf = float64(g.Int())
		case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			gf = float64(g.Uint())
		default:
			return fmt.Errorf("got %T, want a number", got)
		}
		if gf != w {
			return fmt.Errorf("got %v, want %v", gf, w)
		}
		return nil
	}
	return fmt.Errorf("unexpected JSON %T", want)
}

// builder assembles raw GGUF headers for the bad-input table.
type builder struct{ bytes.Buffer }

func (b *builder) u32(v uint32) *builder { binary.Write(b, binary.LittleEndian, v); return b }
func (b *builder) u64(v uint64) *builder { binary.Write(b, binary.LittleEndian, v); return b }
func (b *builder) str(s string) *builder { b.u64(uint64(len(s))); b.WriteString(s); return b }
func (b *builder) head(nt, nkv uint64) *builder {
	return b.u32(Magic).u32(Version).u64(nt).u64(nkv)
}
func (b *builder) tensor(name string, dims []uint64, ty quant.Type, off uint64) *builder {
	b.str(name).u32(uint32(len(dims)))
	for _, d := range dims {
		b.u64(d)
	}
	return b.u32(uint32(ty)).u64(off)
}
func (b *builder) pad(n int) *builder { b.Write(make([]byte, n)); return b }
func (b *builder) alignTo(a int) *builder {
	for b.Len()%a != 0 {
		b.WriteByte(0)
	}
	return b
}

func TestParseBadInput(t *testing.T) {
	tests := []struct {
		name string
		data []byte
		want error
		off  int64 // expected Error.Offset, -2 to skip
	}{
		{"empty", nil, ErrBadMagic, 0},
		{"bad magic", new(builder).u32(0x46554748).u32(3).u64(0).u64(0).Bytes(), ErrBadMagic, 0},
		{"safetensors", append([]byte{8, 0, 0, 0, 0, 0, 0, 0}, []byte("{}      ")...), ErrBadMagic, 0},
		{"version 2", new(builder).u32(Magic).u32(2).u64(0).u64(0).Bytes(), ErrVersion, 4},
		{"version 4", new(builder).u32(Magic).u32(4).u64(0).u64(0).Bytes(), ErrVersion, 4},
		{"header truncated", new(builder).u32(Magic).u32(3).u32(0).Bytes(), ErrTruncated, -2},
		{"huge tensor count", new(builder).head(1<<40, 0).Bytes(), ErrTooLarge, 8},
		{"huge kv count", new(builder).head(0, 1<<40).Bytes(), ErrTooLarge, 16},
		{"tensor count past EOF", new(builder).head(1000, 0).pad(64).Bytes(), ErrTruncated, 8},
		{"kv count past EOF", new(builder).head(0, 1000).pad(64).Bytes(), ErrTruncated, 16},
		{"truncated KV value", new(builder).head(0, 1).str("a.b").u32(uint32(ValueUint64)).u32(7).Bytes(), ErrTruncated, -2},
		{"truncated KV type", new(builder).head(0, 1).str("a.b").pad(2).Bytes(), ErrTruncated, -2},
		{"key past EOF", new(builder).head(0, 1).u64(1000).WriteStringB("abc").pad(10).Bytes(), ErrTruncated, 24},
		{"string value past EOF", new(builder).head(0, 1).str("k").u32(uint32(ValueString)).u64(1 << 20).pad(20).Bytes(), ErrTruncated, 37},
		{"string over the cap", new(builder).head(0, 1).str("k").u32(uint32(ValueString)).u64(1 << 62).pad(20).Bytes(), ErrTooLarge, 37},
		{"huge array count", new(builder).head(0, 1).str("k").u32(uint32(ValueArray)).u32(uint32(ValueUint32)).u64(1 << 60).pad(64).Bytes(), ErrTooLarge, 41},
		{"array longer than file", new(builder).head(0, 1).str("k").u32(uint32(ValueArray)).u32(uint32(ValueUint32)).u64(100).pad(64).Bytes(), ErrTruncated, 41},
		{"string array past EOF", new(builder).head(0, 1).str("k").u32(uint32(ValueArray)).u32(uint32(ValueString)).u64(2).str("x").u64(99).pad(3).Bytes(), ErrTruncated, -2},
		{"nested array", new(builder).head(0, 1).str("k").u32(uint32(ValueArray)).u32(uint32(ValueArray)).u64(0).pad(8).Bytes(), ErrValueType, 37},
		{"bad value type", new(builder).head(0, 1).str("k").u32(13).pad(8).Bytes(), ErrValueType, 33},
		{"bad bool", new(builder).head(0, 1).str("k").u32(uint32(ValueBool)).WriteByteB(2).pad(8).Bytes(), ErrValueType, 37},
		{"duplicate key", new(builder).head(0, 2).str("k").u32(uint32(ValueUint8)).WriteByteB(1).str("k").u32(uint32(ValueUint8)).WriteByteB(1).Bytes(), ErrDuplicateKey, 38},
		{"alignment not u32", new(builder).head(0, 1).str("general.alignment").u32(uint32(ValueUint64)).u64(32).Bytes(), ErrAlignment, -1},
		{"alignment not power of two", new(builder).head(0, 1).str("general.alignment").u32(uint32(ValueUint32)).u32(48).Bytes(), ErrAlignment, -1},
		{"n_dims 5", new(builder).head(1, 0).tensor("t", []uint64{1, 1, 1, 1, 1}, quant.F32, 0).pad(64).Bytes(), ErrDims, 33},
		{"unknown type", new(builder).head(1, 0).tensor("t", []uint64{4}, quant.Type(4), 0).pad(64).Bytes(), ErrUnknownType, 45},
		{"unknown type 99", new(builder).head(1, 0).tensor("t", []uint64{4}, quant.Type(99), 0).pad(64).Bytes(), ErrUnknownType, 45},
		{"block size", new(builder).head(1, 0).tensor("t", []uint64{16}, quant.Q8_0, 0).pad(64).Bytes(), ErrBlockSize, 33},
		{"element overflow", new(builder).head(1, 0).tensor("t", []uint64{1 << 40, 1 << 40}, quant.F32, 0).pad(64).Bytes(), ErrDims, 33},
		{"element overflow 2^62 x 4", new(builder).head(1, 0).tensor("t", []uint64{1 << 62, 4}, quant.F32, 0).pad(64).Bytes(), ErrDims, 33},
		{"dimension over int64", new(builder).head(1, 0).tensor("t", []uint64{1 << 63, 1}, quant.F32, 0).pad(64).Bytes(), ErrDims, 37},
		{"byte size overflow", new(builder).head(1, 0).tensor("t", []uint64{1 << 62}, quant.F32, 0).pad(64).Bytes(), ErrDims, 33},
		{"name too long", new(builder).head(1, 0).tensor(string(bytes.Repeat([]byte("x"), 64)), []uint64{4}, quant.F32, 0).pad(64).Bytes(), ErrTensorName, 24},
		{"name empty", new(builder).head(1, 0).tensor("", []uint64{4}, quant.F32, 0).pad(64).Bytes(), ErrTensorName, 24},
		{"duplicate tensor", new(builder).head(2, 0).tensor("t", []uint64{8}, quant.F32, 0).tensor("t", []uint64{8}, quant.F32, 32).pad(128).Bytes(), ErrDuplicateTensor, 57},
		{"first offset not zero", new(builder).head(1, 0).tensor("t", []uint64{8}, quant.F32, 32).pad(128).Bytes(), ErrOffset, 49},
		{"offset not contiguous", new(builder).head(2, 0).tensor("a", []uint64{8}, quant.F32, 0).tensor("b", []uint64{8}, quant.F32, 64).pad(128).Bytes(), ErrOffset, 82},
		{"offset overlaps", new(builder).head(2, 0).tensor("a", []uint64{16}, quant.F32, 0).tensor("b", []uint64{8}, quant.F32, 32).pad(128).Bytes(), ErrOffset, 82},
		{"data past EOF", new(builder).head(1, 0).tensor("t", []uint64{64}, quant.F32, 0).alignTo(32).pad(100).Bytes(), ErrDataRange, 64},
		{"truncated in the first of three tensors", new(builder).head(3, 0).tensor("a", []uint64{64}, quant.F32, 0).tensor("b", []uint64{8}, quant.F32, 256).tensor("c", []uint64{8}, quant.F32, 288).alignTo(32).pad(100).Bytes(), ErrDataRange, 128},
	}
	// The tensor the error must name, where one is at fault.
	wantTensor := map[string]string{
		"n_dims 5": "t", "unknown type": "t", "first offset not zero": "t", "offset not contiguous": "b",
		"data past EOF": "t", "truncated in the first of three tensors": "a",
	}
	// Text the message must hold: dimension errors print the raw values
	// read and say which one is out of range.
	wantText := map[string][]string{
		"element overflow 2^62 x 4": {"ne[1] = 4 is out of range", "[4611686018427387904 4]"},
		"dimension over int64":      {"ne[0] = 9223372036854775808 is out of range"},
		"byte size overflow":        {"[4611686018427387904] are out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Parse(bytes.NewReader(tt.data), int64(len(tt.data)), "bad.gguf")
			if err == nil {
				t.Fatalf("parsed: %d KVs, %d tensors", len(f.KVs), len(f.Tensors))
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("error %v, want %v", err, tt.want)
			}
			var ge *Error
			if !errors.As(err, &ge) || !ge.BadInput() || ge.Path != "bad.gguf" {
				t.Fatalf("error %#v is not a *gguf.Error naming the file", err)
			}
			if want, ok := wantTensor[tt.name]; ok && ge.Tensor != want {
				t.Errorf("tensor %q, want %q (%v)", ge.Tensor, want, err)
			}
			if tt.off != -2 && ge.Offset != tt.off {
				t.Errorf("offset %d, want %d (%v)", ge.Offset, tt.off, err)
			}
			for _, s := range wantText[tt.name] {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
			t.Log(err)
		})
	}
}

func (b *builder) WriteStringB(s string) *builder { b.WriteString(s); return b }
func (b *builder) WriteByteB(c byte) *builder     { b.WriteByte(c); return b }

// TestParseValidEdgeCases checks files llama.cpp accepts.
func TestParseValidEdgeCases(t *testing.T) {
	b := new(builder).head(2, 2)
	b.str("general.alignment").u32(uint32(ValueUint32)).u32(64)
	b.str("x").u32(uint32(ValueArray)).u32(uint32(ValueFloat64)).u64(2).u64(math.Float64bits(1.5)).u64(math.Float64bits(-2))
	b.tensor("scalar", nil, quant.F32, 0)
	b.tensor("q", []uint64{32, 2}, quant.Q8_0, 64)
	b.alignTo(64)
	b.pad(64 + 68)
	f, err := Parse(bytes.NewReader(b.Bytes()), int64(b.Len()), "ok.gguf")
	if err != nil {
		t.Fatal(err)
	}
	if f.Alignment != 64 || f.DataOffset%64 != 0 {
		t.Errorf("alignment %d data offset %d", f.Alignment, f.DataOffset)
	}
	kv, _ := f.KV("x")
	if got := kv.Value.(Array).Values.([]float64); !reflect.DeepEqual(got, []float64{1.5, -2}) {
		t.Errorf("x = %v", got)
	}
	if q, _ := f.Tensor("q"); q.Size() != 68 {
		t.Errorf("q size %d", q.Size())
	}
}

func TestWriterRoundTrip(t *testing.T) {
	kvs := []KV{
		Str("general.architecture", "test"),
		{"u8", ValueUint8, uint8(7)}, {"i8", ValueInt8, int8(-7)},
		{"u16", ValueUint16, uint16(700)}, {"i16", ValueInt16, int16(-700)},
		U32("u32", 70000), I32("i32", -70000), F32("f32", 1.25), Bool("b", true),
		Str("s", "héllo"), U64("u64", 1<<40), {"i64", ValueInt64, int64(-1 << 40)}, {"f64", ValueFloat64, 2.5},
		Strings("ss", []string{"a", "", "ccc"}), I32s("is", []int32{1, -2, 3}),
		{"bs", ValueArray, Array{ValueBool, []bool{true, false}}},
		{"u8s", ValueArray, Array{ValueUint8, []uint8{1, 2, 3}}},
		{"f32s", ValueArray, Array{ValueFloat32, []float32{0.5}}},
		{"u64s", ValueArray, Array{ValueUint64, []uint64{}}},
	}
	specs := []TensorSpec{
		{"a", []uint64{3}, quant.F32},
		{"b", []uint64{32, 3}, quant.Q8_0},
		{"c", []uint64{4, 2, 1}, quant.F16},
		{"d", []uint64{256}, quant.Q4_K},
	}
	layout, err := PlanLayout(kvs, specs, 0)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "rt.gguf")
	w, err := Create(path, layout, Options{})
	if err != nil {
		t.Fatal(err)
	}
	bodies := make([][]byte, len(specs))
	for i := range specs {
		bodies[i] = bytes.Repeat([]byte{byte(i + 1)}, int(layout.Tensors[i].Size()))
	}
	// Out of order, as a worker pool would.
	for _, i := range []int{2, 0, 3, 1} {
		if err := w.WriteTensor(i, bytes.NewReader(bodies[i])); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("final file exists before Close")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Size != layout.Size || f.Size%32 != 0 {
		t.Errorf("size %d, layout %d", f.Size, layout.Size)
	}
	if !reflect.DeepEqual(f.KVs, kvs) {
		t.Errorf("KVs differ:\n got %v\nwant %v", f.KVs, kvs)
	}
	for i, s := range specs {
		ti := f.Tensors[i]
		if ti.Name != s.Name || ti.Type != s.Type || !reflect.DeepEqual(ti.Dims, s.Dims) {
			t.Errorf("tensor %d: %+v, want %+v", i, ti, s)
		}
		got := make([]byte, ti.Size())
		if _, err := f.Section(ti).ReadAt(got, 0); err != nil || !bytes.Equal(got, bodies[i]) {
			t.Errorf("tensor %s body differs (%v)", s.Name, err)
		}
	}
}

func TestWriterErrors(t *testing.T) {
	layout, err := PlanLayout([]KV{Str("general.architecture", "x")}, []TensorSpec{{"a", []uint64{8}, quant.F32}, {"b", []uint64{8}, quant.F32}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "e.gguf")
	w, err := Create(path, layout, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteTensor(0, bytes.NewReader(make([]byte, 31))); !errors.Is(err, ErrWriteSize) {
		t.Errorf("short body: %v", err)
	}
	if err := w.Close(); err == nil {
		t.Error("Close after a failed write succeeded")
	}
	w.Abort()
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left %v", ents)
	}

	// Missing tensor: Close refuses, the partial file stays for resume.
	w, _ = Create(path, layout, Options{})
	if err := w.WriteTensorBytes(0, make([]byte, 32)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err == nil {
		t.Error("Close with a tensor unwritten succeeded")
	}
	if err := w.Detach(); err != nil {
		t.Fatal(err)
	}
	// Resume: the partial matches, tensor 0 is skipped.
	w, err = Create(path, layout, Options{Resume: true})
	if err != nil || !w.Resumed() {
		t.Fatalf("resume: %v %v", err, w.Resumed())
	}
	w.Skip(0)
	if err := w.WriteTensorBytes(1, bytes.Repeat([]byte{9}, 32)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path); err != nil {
		t.Fatal(err)
	}

	for _, bad := range [][]TensorSpec{
		{{"a", []uint64{16}, quant.Q8_0}},
		{{"a", []uint64{1, 1, 1, 1, 1}, quant.F32}},
		{{"a", []uint64{4}, quant.Type(5)}},
		{{"a", []uint64{4}, quant.F32}, {"a", []uint64{4}, quant.F32}},
		{{string(make([]byte, 64)), []uint64{4}, quant.F32}},
	} {
		if _, err := PlanLayout(nil, bad, 0); err == nil {
			t.Errorf("PlanLayout(%v) succeeded", bad)
		}
	}
	if _, err := PlanLayout([]KV{{"k", ValueUint32, int32(1)}}, nil, 0); err == nil {
		t.Error("mismatched value type accepted")
	}
}
