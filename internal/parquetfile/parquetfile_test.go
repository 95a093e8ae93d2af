package parquetfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A table whose columns do not fit it is refused, naming the column, and
// nothing is written. (The files written are read back with independent
// readers in cmd/ferry's TestInspectParquet and gguf/quantize's
// TestReportParquet.)
func TestWriteRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		rows int
		col  Column
		want string
	}{
		{"short", 2, Column{Name: "a", Kind: Int64, Int64s: []int64{1}}, `"a": 1 values for 2 rows`},
		{"null marks on a required column", 1, Column{Name: "b", Kind: String, Strings: []string{"x"}, Null: []bool{true}}, `"b": null marks`},
		{"null marks not one a row", 2, Column{Name: "c", Kind: Float64, Nullable: true, Float64s: []float64{1, 2}, Null: []bool{true}}, `"c": null marks`},
		{"nullable list", 1, Column{Name: "d", Kind: Int64List, Nullable: true, Lists: [][]int64{{1}}}, `"d": a list column cannot be nullable`},
		{"unknown kind", 1, Column{Name: "e", Kind: Kind(99)}, `"e": -1 values`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "t.parquet")
			err := Write(p, tc.rows, []Column{tc.col}, "test")
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), p) {
				t.Fatalf("err %v, want the path and %q", err, tc.want)
			}
			if ents, _ := os.ReadDir(filepath.Dir(p)); len(ents) != 0 {
				t.Errorf("left %d entries", len(ents))
			}
		})
	}
}

// The file is framed as Parquet: the magic at both ends and the footer's
// length before the last one, pointing at a footer that starts after the
// column data and ends with the compact protocol's stop byte.
func TestFraming(t *testing.T) {
	p := filepath.Join(t.TempDir(), "t.parquet")
	cols := []Column{
		{Name: "s", Kind: String, Strings: []string{"a", "bc"}},
		{Name: "l", Kind: Int64List, Lists: [][]int64{{1, 2}, {}}},
	}
	if err := Write(p, 2, cols, "test"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	n := len(b)
	if string(b[:4]) != "PAR1" || string(b[n-4:]) != "PAR1" {
		t.Fatalf("magic %q … %q", b[:4], b[n-4:])
	}
	fl := int(uint32(b[n-8]) | uint32(b[n-7])<<8 | uint32(b[n-6])<<16 | uint32(b[n-5])<<24)
	if fl <= 0 || fl > n-12 || b[n-9] != 0 {
		t.Fatalf("footer length %d of a %d-byte file, last footer byte %#x", fl, n, b[n-9])
	}
	if !strings.Contains(string(b[n-8-fl:n-8]), "test") {
		t.Error("footer lacks created_by")
	}
}
