package inspect

import (
	"github.com/ferry-llm/ferry/internal/parquetfile"
)

// WriteParquet writes rows to path atomically, one row per tensor: name,
// dtype, shape (list<int64>), bytes, shard, offset, and sha256 (null when
// --hash was not given); createdBy names the writing program ("ferry
// 0.1.0").
func WriteParquet(path string, rows []Row, createdBy string) error {
	cols := []parquetfile.Column{
		{Name: "name", Kind: parquetfile.String},
		{Name: "dtype", Kind: parquetfile.String},
		{Name: "shape", Kind: parquetfile.Int64List},
		{Name: "bytes", Kind: parquetfile.Int64},
		{Name: "shard", Kind: parquetfile.String},
		{Name: "offset", Kind: parquetfile.Int64},
		{Name: "sha256", Kind: parquetfile.String, Nullable: true, Null: make([]bool, len(rows))},
	}
	for i, r := range rows {
		cols[0].Strings = append(cols[0].Strings, r.Name)
		cols[1].Strings = append(cols[1].Strings, r.DType)
		cols[2].Lists = append(cols[2].Lists, r.Shape)
		cols[3].Int64s = append(cols[3].Int64s, r.Bytes)
		cols[4].Strings = append(cols[4].Strings, r.Shard)
		cols[5].Int64s = append(cols[5].Int64s, r.Offset)
		cols[6].Strings = append(cols[6].Strings, r.SHA256)
		cols[6].Null[i] = r.SHA256 == ""
	}
	return parquetfile.Write(path, len(rows), cols, createdBy)
}
