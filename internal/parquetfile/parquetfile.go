// Package parquetfile writes one Arrow record batch as a Parquet file,
// atomically (fsutil.CreateAtomic): the tables `ferry inspect --parquet`
// and the quantizer's --report write.
package parquetfile

import (
	"fmt"
	"io"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"

	"github.com/ferry-llm/ferry/internal/fsutil"
)

// onlyWriter hides the temp file's Close from pqarrow, which closes its
// sink; the AtomicFile must stay open for Commit's fsync and rename.
type onlyWriter struct{ io.Writer }

// Write writes rec (of its schema) to path atomically, Snappy-compressed;
// createdBy names the writing program ("ferry 0.1.0").
func Write(path string, rec arrow.RecordBatch, createdBy string) (err error) {
	af, err := fsutil.CreateAtomic(path)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			af.Abort()
			err = fmt.Errorf("%s: writing parquet: %w", path, err)
		}
	}()
	props := parquet.NewWriterProperties(parquet.WithCompression(compress.Codecs.Snappy), parquet.WithCreatedBy(createdBy))
	w, err := pqarrow.NewFileWriter(rec.Schema(), onlyWriter{af}, props, pqarrow.DefaultWriterProps())
	if err != nil {
		return err
	}
	if err := w.Write(rec); err != nil {
		w.Close()
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	return af.Commit()
}
