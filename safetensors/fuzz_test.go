package safetensors_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// FuzzHeader: Parse never panics on arbitrary bytes, every rejection is a
// *safetensors.Error, and whatever it accepts satisfies the format's
// invariants and survives re-encoding unchanged.
// Seeds: testdata/fuzz/FuzzHeader (real reference headers, small valid
// files, the bad-input table).
func FuzzHeader(f *testing.F) {
	f.Add([]byte("\x02\x00\x00\x00\x00\x00\x00\x00{}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := safetensors.Parse(bytes.NewReader(data), int64(len(data)), "fuzz")
		if err != nil {
			var se *safetensors.Error
			if !errors.As(err, &se) || !se.BadInput() {
				t.Fatalf("rejection is not a bad-input *Error: %v", err)
			}
			return
		}
		end := int64(0)
		for _, ti := range st.Tensors {
			if ti.Begin != end {
				t.Fatalf("accepted a gap or overlap at %q", ti.Name)
			}
			want, err := tensor.ByteSize(ti.DType, ti.Shape)
			if err != nil || want != ti.Size() {
				t.Fatalf("accepted %q with %d bytes for %s %v (%v)", ti.Name, ti.Size(), ti.DType, ti.Shape, err)
			}
			n, err := io.Copy(io.Discard, st.Section(ti))
			if err != nil || n != ti.Size() {
				t.Fatalf("section of %q: %d of %d bytes: %v", ti.Name, n, ti.Size(), err)
			}
			end = ti.End
		}
		if st.DataOffset()+end != int64(len(data)) {
			t.Fatalf("accepted a file whose tensors end at %d of %d", st.DataOffset()+end, len(data))
		}
		// Re-encode the accepted tensor list and parse it again.
		specs := make([]safetensors.TensorSpec, len(st.Tensors))
		for i, ti := range st.Tensors {
			specs[i] = safetensors.TensorSpec{Name: ti.Name, DType: ti.DType, Shape: ti.Shape}
		}
		hdr, infos, err := safetensors.EncodeHeader(st.Metadata, specs)
		if err != nil {
			if len(data) > 4<<20 { // a header at the size limit may grow past it
				return
			}
			t.Fatalf("cannot re-encode an accepted header: %v", err)
		}
		body := data[st.DataOffset():]
		again, err := safetensors.Parse(bytes.NewReader(append(hdr, body...)), int64(len(hdr)+len(body)), "re-encoded")
		if err != nil {
			t.Fatalf("re-encoded header rejected: %v", err)
		}
		if !sameInfos(again.Tensors, infos) || !sameInfos(again.Tensors, st.Tensors) {
			t.Fatalf("re-encoding changed the tensors:\n%v\n%v", st.Tensors, again.Tensors)
		}
		if len(st.Metadata) != 0 && !reflect.DeepEqual(again.Metadata, st.Metadata) {
			t.Fatalf("re-encoding changed the metadata: %v → %v", st.Metadata, again.Metadata)
		}
	})
}

// sameInfos compares tensor lists, treating nil and empty alike.
func sameInfos(a, b []safetensors.TensorInfo) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !reflect.DeepEqual(a[i], b[i]) {
			return false
		}
	}
	return true
}

// FuzzIndex: ParseIndex never panics, every rejection is a bad-input
// *Error, and an accepted weight map survives WriteIndex's encoding.
// Seeds: testdata/fuzz/FuzzIndex (the reference indexes and edge cases).
func FuzzIndex(f *testing.F) {
	f.Add([]byte(`{"metadata":{"total_size":0},"weight_map":{}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		idx, err := safetensors.ParseIndex(data, "fuzz.json")
		if err != nil {
			var se *safetensors.Error
			if !errors.As(err, &se) || !se.BadInput() {
				t.Fatalf("rejection is not a bad-input *Error: %v", err)
			}
			return
		}
		if idx.WeightMap == nil {
			t.Fatal("accepted an index without weight_map")
		}
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(map[string]any{"weight_map": idx.WeightMap}); err != nil {
			t.Fatal(err)
		}
		again, err := safetensors.ParseIndex(b.Bytes(), "re-encoded")
		if err != nil {
			t.Fatalf("re-encoded index rejected: %v\n%s", err, b.Bytes())
		}
		if !reflect.DeepEqual(again.WeightMap, idx.WeightMap) {
			t.Fatalf("weight map changed on re-encoding")
		}
	})
}
