package mlxpack

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// The expected strings are what CPython 3.12's json.dumps prints for the
// same values (json.dumps(x), and json.dumps(json.loads(s)) for the
// literals).
func TestPyFloat(t *testing.T) {
	for _, c := range []struct {
		in   float64
		want string
	}{
		{0, "0.0"}, {1, "1.0"}, {1e-6, "1e-06"}, {1e-5, "1e-05"}, {0.0001, "0.0001"},
		{0.00392156862745098, "0.00392156862745098"}, {1e16, "1e+16"}, {1e15, "1000000000000000.0"},
		{123456789012345678.0, "1.2345678901234568e+17"}, {1.5e300, "1.5e+300"}, {5e-324, "5e-324"},
		{0.1, "0.1"}, {2.5, "2.5"}, {10000000.0, "10000000.0"}, {1e22, "1e+22"},
	} {
		if got := pyFloat(c.in); got != c.want {
			t.Errorf("pyFloat(%v) = %s, want %s", c.in, got, c.want)
		}
	}
	for _, c := range []struct{ in, want string }{
		{"1E5", "100000.0"}, {"-0", "0"}, {"12345678901234567890123", "12345678901234567890123"},
		{"1e400", "Infinity"}, {"-1e400", "-Infinity"}, {"1e-400", "0.0"}, {"1.0e-7", "1e-07"}, {"-0.0", "-0.0"},
		{"10000000.0", "10000000.0"}, {"511", "511"},
	} {
		got, err := pyNumber(json.Number(c.in))
		if err != nil || got != c.want {
			t.Errorf("pyNumber(%s) = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
}

func TestPyString(t *testing.T) {
	var b bytes.Buffer
	pyString(&b, "a\"\\\n\r\t\b\f\x01\x7f é€😀 /")
	if want := `"a\"\\\n\r\t\b\f\u0001\u007f \u00e9\u20ac\ud83d\ude00 /"`; b.String() != want {
		t.Errorf("pyString = %s, want %s", b.String(), want)
	}
}

// TestPyJSONRoundTrip: every JSON file mlx-lm 0.32's own code wrote in the
// golden sets (config.json, the index; the dense and the MoE wrapper), read with its key order and written again by pyJSON, is the same
// bytes (config.json with the top level sorted, as save_config writes it).
func TestPyJSONRoundTrip(t *testing.T) {
	files, _ := filepath.Glob("testdata/qwen35vl_mlx/*/*.json")
	more, _ := filepath.Glob("testdata/qwen35vl_mlx/moevl*/*/*.json")
	files = append(files, more...)
	if len(files) < 12 {
		t.Fatalf("golden JSON files: %v", files)
	}
	for _, f := range files {
		data := mustRead(t, f)
		order, err := keyOrderOf(data)
		if err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var v map[string]any
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		base := filepath.Base(f)
		if base != "config.json" && base != "model.safetensors.index.json" {
			continue // transformers' files (indent 2)
		}
		got, err := pyJSON(v, order, base == "config.json")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Errorf("%s: pyJSON writes\n%s\nmlx-lm wrote\n%s", f, got, data)
		}
	}
}

// Nested objects keep the source order with added keys at the end; the top
// level is sorted when asked; a key order from a document deeper than
// maxOrderDepth is dropped (written sorted), not an error.
func TestPyJSONOrder(t *testing.T) {
	src := []byte(`{"z": {"b": 1, "a": [{"y": 1, "x": 2}], "c": {}}, "a": []}`)
	order, err := keyOrderOf(src)
	if err != nil {
		t.Fatal(err)
	}
	v := map[string]any{
		"z": map[string]any{"b": 1, "a": []any{map[string]any{"y": 1, "x": 2}}, "c": map[string]any{}, "new": true, "aa": nil},
		"a": []any{},
	}
	got, err := pyJSON(v, order, true)
	if err != nil {
		t.Fatal(err)
	}
	want := `{
    "a": [],
    "z": {
        "b": 1,
        "a": [
            {
                "y": 1,
                "x": 2
            }
        ],
        "c": {},
        "aa": null,
        "new": true
    }
}`
	if string(got) != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	deep := bytes.Repeat([]byte(`{"k":`), maxOrderDepth+5)
	deep = append(deep, '1')
	deep = append(deep, bytes.Repeat([]byte(`}`), maxOrderDepth+5)...)
	if _, err := keyOrderOf(deep); err != nil {
		t.Errorf("deep document: %v", err)
	}
	for _, bad := range []string{`{"a":`, `{"a" 1}`, `[1,]`, `}`} {
		if _, err := keyOrderOf([]byte(bad)); err == nil {
			t.Errorf("keyOrderOf(%q): no error", bad)
		}
	}
}

func TestConfigOrderErrors(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "config.json")
	if err := os.WriteFile(p, []byte(`{"a": `), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := configOrder(p); err == nil {
		t.Error("truncated config: no error")
	}
}
