package inspect

import (
	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/ferry-llm/ferry/internal/parquetfile"
)

// Schema is the Parquet layout of the per-tensor table; sha256 is
// null when --hash was not given.
var Schema = arrow.NewSchema([]arrow.Field{
	{Name: "name", Type: arrow.BinaryTypes.String},
	{Name: "dtype", Type: arrow.BinaryTypes.String},
	{Name: "shape", Type: arrow.ListOf(arrow.PrimitiveTypes.Int64)},
	{Name: "bytes", Type: arrow.PrimitiveTypes.Int64},
	{Name: "shard", Type: arrow.BinaryTypes.String},
	{Name: "offset", Type: arrow.PrimitiveTypes.Int64},
	{Name: "sha256", Type: arrow.BinaryTypes.String, Nullable: true},
}, nil)

// WriteParquet writes rows to path atomically; createdBy names the
// writing program ("ferry 0.1.0").
func WriteParquet(path string, rows []Row, createdBy string) error {
	b := array.NewRecordBuilder(memory.DefaultAllocator, Schema)
	defer b.Release()
	name := b.Field(0).(*array.StringBuilder)
	dtype := b.Field(1).(*array.StringBuilder)
	shape := b.Field(2).(*array.ListBuilder)
	dims := shape.ValueBuilder().(*array.Int64Builder)
	size := b.Field(3).(*array.Int64Builder)
	shard := b.Field(4).(*array.StringBuilder)
	offset := b.Field(5).(*array.Int64Builder)
	sum := b.Field(6).(*array.StringBuilder)
	for _, r := range rows {
		name.Append(r.Name)
		dtype.Append(r.DType)
		shape.Append(true)
		dims.AppendValues(r.Shape, nil)
		size.Append(r.Bytes)
		shard.Append(r.Shard)
		offset.Append(r.Offset)
		if r.SHA256 == "" {
			sum.AppendNull()
		} else {
			sum.Append(r.SHA256)
		}
	}
	rec := b.NewRecordBatch()
	defer rec.Release()
	return parquetfile.Write(path, rec, createdBy)
}
