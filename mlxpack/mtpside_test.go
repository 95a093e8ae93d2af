package mlxpack

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/modulepaths"
	"github.com/ferry-llm/ferry/safetensors"
)

var (
	modelFileRE = regexp.MustCompile(`^model.*\.safetensors$`) // mlx-lm load_model's glob
	sideFileRE  = regexp.MustCompile(`^mtp(-\d{5}-of-\d{5})?\.safetensors$`)
)

// TestKeepMTPSideFiles: a kept MTP head is written to side files that
// mlx-lm's model*.safetensors glob does not match, and nothing else changes
// for mlx-lm: the trunk's shards are byte for byte those of the same
// conversion without the head. The index lists every tensor of every file
// (the head's under its side file) and config.json records where the head
// is while still promising it.
func TestKeepMTPSideFiles(t *testing.T) {
	for _, tc := range []struct {
		name      string
		opts      QuantizeOptions
		wantSide  []string
		wantModel int // model*.safetensors files
	}{
		{"4-bit", QuantizeOptions{Bits: 4, GroupSize: 64}, []string{"mtp.safetensors"}, 1},
		{"float", QuantizeOptions{}, []string{"mtp.safetensors"}, 1},
		// 256 KiB shards: the trunk and the head are each split, as
		// make_shards splits (the head's own shards counted apart).
		{"split", QuantizeOptions{Bits: 8, GroupSize: 64, ShardSize: 256 << 10},
			[]string{"mtp-00001-of-00005.safetensors", "mtp-00002-of-00005.safetensors", "mtp-00003-of-00005.safetensors",
				"mtp-00004-of-00005.safetensors", "mtp-00005-of-00005.safetensors"}, 18},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			without, with := filepath.Join(dir, "without"), filepath.Join(dir, "with")
			convertTo(t, qwen35Base, without, tc.opts, QuantizeRunOptions{Jobs: 2})
			keep := tc.opts
			keep.KeepMTP = true
			res := convertTo(t, qwen35Base, with, keep, QuantizeRunOptions{Jobs: 2})

			var side, model []string
			for _, f := range res.Files {
				switch {
				case modelFileRE.MatchString(f):
					model = append(model, f)
				case strings.HasSuffix(f, ".safetensors"):
					side = append(side, f)
				}
			}
			if !reflect.DeepEqual(side, tc.wantSide) || len(model) != tc.wantModel {
				t.Fatalf("files %v: side files %v, want %v; %d model*.safetensors, want %d", res.Files, side, tc.wantSide, len(model), tc.wantModel)
			}
			for _, f := range side {
				if !sideFileRE.MatchString(f) || modelFileRE.MatchString(f) {
					t.Errorf("%s: not a side file name, or one mlx-lm's glob reads", f)
				}
			}
			// What mlx-lm loads is the conversion without the head.
			for _, f := range model {
				if !bytes.Equal(mustRead(t, filepath.Join(with, f)), mustRead(t, filepath.Join(without, f))) {
					t.Errorf("%s differs from the conversion without the head", f)
				}
			}
			var noHead []string
			for _, f := range resFiles(t, without) {
				if modelFileRE.MatchString(f) {
					noHead = append(noHead, f)
				}
			}
			if !slices.Equal(noHead, model) {
				t.Errorf("model*.safetensors %v, without the head %v", model, noHead)
			}

			// Every head tensor is in a side file, every other in model*.
			ck, err := safetensors.OpenDir(with)
			if err != nil {
				t.Fatalf("the index does not describe the directory: %v", err)
			}
			defer ck.Close()
			inSide := 0
			for _, l := range ck.Tensors() {
				head := strings.HasPrefix(l.Info.Name, modulepaths.MLXQwen35MTP)
				if head != sideFileRE.MatchString(l.Shard.Name) {
					t.Errorf("%s is in %s", l.Info.Name, l.Shard.Name)
				}
				if head {
					inSide++
				}
			}
			if inSide != 31 && tc.opts.Bits > 0 || inSide != 15 && tc.opts.Bits == 0 {
				t.Errorf("%d head tensors in the side files", inSide)
			}

			var cfg map[string]any
			if err := json.Unmarshal(mustRead(t, filepath.Join(with, "config.json")), &cfg); err != nil {
				t.Fatal(err)
			}
			rec, _ := cfg[MTPSideKey].(map[string]any)
			files, _ := json.Marshal(rec["files"])
			want, _ := json.Marshal(side)
			if string(files) != string(want) || rec["tensors"] != float64(inSide) || rec["layers"] != float64(1) || rec["reason"] == nil {
				t.Errorf("config.json %s = %v", MTPSideKey, rec)
			}
			if cfg["mtp_num_hidden_layers"] != float64(1) || cfg[MTPRecordKey] != nil {
				t.Errorf("config.json: mtp_num_hidden_layers %v, %s %v: the head is there, promised", cfg["mtp_num_hidden_layers"], MTPRecordKey, cfg[MTPRecordKey])
			}
		})
	}
}

// resFiles lists dir's files, sorted.
func resFiles(t *testing.T, dir string) []string {
	t.Helper()
	ms, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range ms {
		out = append(out, filepath.Base(m))
	}
	sort.Strings(out)
	return out
}
