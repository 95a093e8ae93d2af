// Package parquetfile writes a small flat table as a Parquet file,
// atomically (fsutil.CreateAtomic): the tables `ferry inspect --parquet`
// and the quantizer's --report write. It is its own writer of the format
// (apache/parquet-format: a PAR1 file, one row group, one PLAIN data page
// per column, uncompressed, the footer in Thrift's compact protocol),
// enough for columns of strings, int32, int64, float64 (each optionally
// null) and lists of int64 (never null). Readers see Arrow's types:
// pyarrow 25.0.1 and pandas 3.0.6 read `inspect --parquet` and --report
// files as string, int32, int64, double and list<element: int64>, nulls
// where they are (checked by hand on the GPU host); the tests read them
// back with parquet-go.
package parquetfile

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/ferry-llm/ferry/internal/fsutil"
)

// Kind is the type of a column's values.
type Kind int

const (
	String    Kind = iota // UTF-8 text (BYTE_ARRAY, STRING)
	Int32                 // INT32
	Int64                 // INT64
	Float64               // DOUBLE
	Int64List             // LIST of INT64 (a tensor's shape)
)

// Column is one column of a table: its name, kind, and the values of the
// field of that kind, one per row. A Nullable column marks null rows in
// Null (the value at a null row is ignored); a list column is never null
// (an empty list is a list).
type Column struct {
	Name     string
	Kind     Kind
	Nullable bool
	Null     []bool
	Strings  []string
	Int32s   []int32
	Int64s   []int64
	Float64s []float64
	Lists    [][]int64
}

func (c *Column) len() int {
	switch c.Kind {
	case String:
		return len(c.Strings)
	case Int32:
		return len(c.Int32s)
	case Int64:
		return len(c.Int64s)
	case Float64:
		return len(c.Float64s)
	case Int64List:
		return len(c.Lists)
	}
	return -1
}

func (c *Column) null(i int) bool { return c.Nullable && c.Null != nil && c.Null[i] }

// Write writes the table (rows rows of cols) to path atomically;
// createdBy names the writing program ("ferry 0.1.0").
func Write(path string, rows int, cols []Column, createdBy string) (err error) {
	for i := range cols {
		c := &cols[i]
		if n := c.len(); n != rows {
			return fmt.Errorf("%s: parquet column %q: %d values for %d rows", path, c.Name, n, rows)
		}
		if c.Null != nil && (!c.Nullable || len(c.Null) != rows) {
			return fmt.Errorf("%s: parquet column %q: null marks on a column that is not nullable or not one a row", path, c.Name)
		}
		if c.Kind == Int64List && c.Nullable {
			return fmt.Errorf("%s: parquet column %q: a list column cannot be nullable", path, c.Name)
		}
	}
	b := encode(rows, cols, createdBy)
	af, err := fsutil.CreateAtomic(path)
	if err != nil {
		return err
	}
	if _, err := af.Write(b); err != nil {
		af.Abort()
		return fmt.Errorf("%s: writing parquet: %w", path, err)
	}
	return af.Commit()
}

// Parquet's enums (parquet.thrift).
const (
	typeInt32     = 1
	typeInt64     = 2
	typeDouble    = 5
	typeByteArray = 6

	repRequired = 0
	repOptional = 1
	repRepeated = 2

	convertedUTF8 = 0
	convertedList = 3

	encPlain = 0
	encRLE   = 3

	pageData = 0
)

// encode lays the file out: magic, each column's page (header and data),
// the footer (FileMetaData), its length and the magic again.
func encode(rows int, cols []Column, createdBy string) []byte {
	var out bytes.Buffer
	out.WriteString("PAR1")
	chunks := make([]chunkMeta, len(cols))
	for i := range cols {
		chunks[i] = writeColumn(&out, rows, &cols[i])
	}
	footer := fileMetaData(rows, cols, chunks, createdBy)
	out.Write(footer)
	binary.Write(&out, binary.LittleEndian, uint32(len(footer)))
	out.WriteString("PAR1")
	return out.Bytes()
}

// chunkMeta is what the footer says of a column chunk.
type chunkMeta struct {
	offset, size int64 // of the page (header and data)
	values       int64 // level entries in the page
}

// writeColumn writes col's one data page (header, levels, values).
func writeColumn(out *bytes.Buffer, rows int, c *Column) chunkMeta {
	var data bytes.Buffer
	var rep, def []int
	values := 0
	switch {
	case c.Kind == Int64List:
		// required group (LIST) { repeated group list { optional int64
		// element } } (Arrow's list<int64>, whose elements may be null;
		// these never are): repetition level 1 continues a list,
		// definition level 2 is an element, 0 an empty list.
		for _, l := range c.Lists {
			if len(l) == 0 {
				rep, def = append(rep, 0), append(def, 0)
				continue
			}
			for j, v := range l {
				rep, def = append(rep, min(j, 1)), append(def, 2)
				binary.Write(&data, binary.LittleEndian, v)
			}
		}
		values = len(def)
	default:
		for i := 0; i < rows; i++ {
			if c.Nullable {
				if c.null(i) {
					def = append(def, 0)
					continue
				}
				def = append(def, 1)
			}
			switch c.Kind {
			case String:
				binary.Write(&data, binary.LittleEndian, uint32(len(c.Strings[i])))
				data.WriteString(c.Strings[i])
			case Int32:
				binary.Write(&data, binary.LittleEndian, c.Int32s[i])
			case Int64:
				binary.Write(&data, binary.LittleEndian, c.Int64s[i])
			case Float64:
				binary.Write(&data, binary.LittleEndian, math.Float64bits(c.Float64s[i]))
			}
		}
		values = rows
	}
	var page bytes.Buffer
	if c.Kind == Int64List {
		writeLevels(&page, rep)
	}
	if c.Kind == Int64List || c.Nullable {
		writeLevels(&page, def)
	}
	page.Write(data.Bytes())

	var h thrift
	h.i32(1, pageData)
	h.i32(2, int32(page.Len()))
	h.i32(3, int32(page.Len()))
	h.beginStruct(5) // DataPageHeader
	h.i32(1, int32(values))
	h.i32(2, encPlain)
	h.i32(3, encRLE)
	h.i32(4, encRLE)
	h.endStruct()
	h.stop()

	m := chunkMeta{offset: int64(out.Len()), values: int64(values)}
	out.Write(h.Bytes())
	out.Write(page.Bytes())
	m.size = int64(out.Len()) - m.offset
	return m
}

// writeLevels writes levels (0, 1 or 2: a bit width of at most 2) as the
// RLE / bit-packed hybrid, all RLE runs (each value in one byte), prefixed
// by its byte length.
func writeLevels(out *bytes.Buffer, levels []int) {
	var b []byte
	for i := 0; i < len(levels); {
		j := i
		for j < len(levels) && levels[j] == levels[i] {
			j++
		}
		b = binary.AppendUvarint(b, uint64(j-i)<<1) // an RLE run of j−i
		b = append(b, byte(levels[i]))              // its value, one byte
		i = j
	}
	binary.Write(out, binary.LittleEndian, uint32(len(b)))
	out.Write(b)
}

// fileMetaData is the footer: the schema, one row group holding every
// column chunk, the row count and the writer's name.
func fileMetaData(rows int, cols []Column, chunks []chunkMeta, createdBy string) []byte {
	var t thrift
	t.i32(1, 1) // version
	t.beginList(2, ctStruct, len(cols)+1+2*countLists(cols))
	t.listStruct()
	t.str(4, "schema")
	t.i32(5, int32(len(cols)))
	t.endStruct()
	for i := range cols {
		c := &cols[i]
		t.listStruct()
		switch c.Kind {
		case Int64List:
			t.i32(3, repRequired)
			t.str(4, c.Name)
			t.i32(5, 1)
			t.i32(6, convertedList)
			t.beginStruct(10) // LogicalType
			t.beginStruct(3)  // LIST
			t.endStruct()
			t.endStruct()
			t.endStruct()
			t.listStruct()
			t.i32(3, repRepeated)
			t.str(4, "list")
			t.i32(5, 1)
			t.endStruct()
			t.listStruct()
			t.i32(1, typeInt64)
			t.i32(3, repOptional)
			t.str(4, "element")
			t.endStruct()
			continue
		case String:
			t.i32(1, typeByteArray)
		case Int32:
			t.i32(1, typeInt32)
		case Int64:
			t.i32(1, typeInt64)
		case Float64:
			t.i32(1, typeDouble)
		}
		if c.Nullable {
			t.i32(3, repOptional)
		} else {
			t.i32(3, repRequired)
		}
		t.str(4, c.Name)
		if c.Kind == String {
			t.i32(6, convertedUTF8)
			t.beginStruct(10) // LogicalType
			t.beginStruct(1)  // STRING
			t.endStruct()
			t.endStruct()
		}
		t.endStruct()
	}
	t.i64(3, int64(rows))
	t.beginList(4, ctStruct, 1) // one row group
	t.listStruct()
	t.beginList(1, ctStruct, len(cols))
	var total int64
	for i := range cols {
		c, m := &cols[i], chunks[i]
		total += m.size
		t.listStruct() // ColumnChunk
		t.i64(2, m.offset)
		t.beginStruct(3) // ColumnMetaData
		switch c.Kind {
		case String:
			t.i32(1, typeByteArray)
		case Int32:
			t.i32(1, typeInt32)
		case Int64, Int64List:
			t.i32(1, typeInt64)
		case Float64:
			t.i32(1, typeDouble)
		}
		t.beginList(2, ctI32, 2)
		t.listI32(encPlain)
		t.listI32(encRLE)
		path := []string{c.Name}
		if c.Kind == Int64List {
			path = append(path, "list", "element")
		}
		t.beginList(3, ctBinary, len(path))
		for _, p := range path {
			t.listStr(p)
		}
		t.i32(4, 0) // UNCOMPRESSED
		t.i64(5, m.values)
		t.i64(6, m.size)
		t.i64(7, m.size)
		t.i64(9, m.offset)
		t.endStruct()
		t.endStruct()
	}
	t.i64(2, total)
	t.i64(3, int64(rows))
	t.endStruct()
	t.str(6, createdBy)
	t.stop()
	return t.Bytes()
}

func countLists(cols []Column) int {
	n := 0
	for _, c := range cols {
		if c.Kind == Int64List {
			n++
		}
	}
	return n
}

// thrift writes Thrift's compact protocol: field headers carry the delta
// from the previous field id of the same struct, integers are zigzag
// varints, a struct ends with a stop byte.
type thrift struct {
	bytes.Buffer
	last  int16   // previous field id in the current struct
	stack []int16 // the enclosing structs' last ids
}

// Compact protocol type codes.
const (
	ctI32    = 5
	ctI64    = 6
	ctBinary = 8
	ctList   = 9
	ctStruct = 12
)

func (t *thrift) field(id int16, typ byte) {
	if d := id - t.last; d > 0 && d <= 15 {
		t.WriteByte(byte(d)<<4 | typ)
	} else {
		t.WriteByte(typ)
		t.varint(int64(id))
	}
	t.last = id
}

func (t *thrift) varint(v int64) {
	t.Write(binary.AppendUvarint(nil, uint64(v<<1)^uint64(v>>63)))
}

func (t *thrift) i32(id int16, v int32) { t.field(id, ctI32); t.varint(int64(v)) }
func (t *thrift) i64(id int16, v int64) { t.field(id, ctI64); t.varint(v) }
func (t *thrift) str(id int16, s string) {
	t.field(id, ctBinary)
	t.Write(binary.AppendUvarint(nil, uint64(len(s))))
	t.WriteString(s)
}

func (t *thrift) beginStruct(id int16) {
	t.field(id, ctStruct)
	t.stack = append(t.stack, t.last)
	t.last = 0
}

func (t *thrift) endStruct() {
	t.stop()
	t.last = t.stack[len(t.stack)-1]
	t.stack = t.stack[:len(t.stack)-1]
}

func (t *thrift) stop() { t.WriteByte(0) }

// beginList starts a list field of n elements of type typ; they follow
// (listStruct … endStruct, listI32, listStr).
func (t *thrift) beginList(id int16, typ byte, n int) {
	t.field(id, ctList)
	if n < 15 {
		t.WriteByte(byte(n)<<4 | typ)
	} else {
		t.WriteByte(0xf0 | typ)
		t.Write(binary.AppendUvarint(nil, uint64(n)))
	}
}

// listStruct starts a struct element of a list.
func (t *thrift) listStruct() {
	t.stack = append(t.stack, t.last)
	t.last = 0
}

func (t *thrift) listI32(v int32) { t.varint(int64(v)) }

func (t *thrift) listStr(s string) {
	t.Write(binary.AppendUvarint(nil, uint64(len(s))))
	t.WriteString(s)
}
