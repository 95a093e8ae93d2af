package pipeline

import (
	"context"
	"fmt"
	"os"

	"github.com/ferry-llm/ferry/transfer"
)

// importMemory is an import's peak: its copy buffers (Ingest keeps four of
// 4 MiB in flight) and a margin.
const importMemory = 32 << 20

var _ Planner = (*importStage)(nil)

// Plan lists the files an import will read (stat only: no data read) and
// offers the source directory as the preview of its outputs, which are
// the same files in the same layout, so the stages reading the import are
// planned before it runs.
func (s *importStage) Plan(ctx context.Context, env *Env) (*StagePlan, error) {
	if transfer.S3Source(s.Path) {
		return s.planS3(ctx)
	}
	files, err := s.listSources()
	if err != nil {
		return nil, err
	}
	var total int64
	for _, f := range files {
		total += f.stamp.Size
	}
	p := &StagePlan{Summary: fmt.Sprintf("%d files, %s", len(files), FormatBytes(total)), Memory: importMemory}
	if fi, err := os.Stat(s.Path); err == nil && fi.IsDir() {
		p.Preview = s.Path
	}
	return p, nil
}
