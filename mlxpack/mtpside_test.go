package mlxpack

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	desc "github.com/ferry-llm/ferry/internal/family"
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
				head := strings.HasPrefix(l.Info.Name, desc.MLXQwen35MTP)
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

// deviceRun is what check_logits.py recorded for one mlx-lm version (the
// fields this test reads).
type deviceRun struct {
	MLXLM     string `json:"mlx_lm"`
	Artifacts map[string]struct {
		Loaded              bool `json:"loaded"`
		MTPParametersLoaded int  `json:"mtp_parameters_loaded"`
		Files               map[string]struct {
			SHA256 string `json:"sha256"`
			Size   int64  `json:"size"`
		} `json:"files"`
	} `json:"artifacts"`
	Compare map[string]struct {
		Identical  bool    `json:"identical"`
		MaxAbsDiff float64 `json:"max_abs_diff"`
	} `json:"compare"`
}

// TestKeepMTPAsLoaded holds, without MLX, what the recorded device run
// (testdata/mlx_sidefile, PROVENANCE.md there) showed: released mlx-lm
// v0.31.3 and 0.32.0 both load ferry's 4-bit Qwen3.5 with the head in
// mtp.safetensors and give logits bit for bit those of the same conversion
// without the head (and of mlx-lm's own convert), where the head in
// model.safetensors (ferry before this layout) made v0.31.3 compute garbage.
// ferry's output for that source must still be exactly what was loaded:
// every file's sha256, config.json up to the wording of ferry's own
// records. A change to the layout (or to any byte mlx-lm reads) fails here
// until the run is made again.
func TestKeepMTPAsLoaded(t *testing.T) {
	const dir = "testdata/mlx_sidefile"
	runs := map[string]deviceRun{}
	for _, v := range []string{"0.31.3", "0.32.0"} {
		var r deviceRun
		if err := json.Unmarshal(mustRead(t, filepath.Join(dir, "sidefile_"+v+".json")), &r); err != nil {
			t.Fatal(err)
		}
		if r.MLXLM != v {
			t.Fatalf("sidefile_%s.json is mlx-lm %s's run", v, r.MLXLM)
		}
		for _, a := range []string{"side", "no_mtp", "mtp_in_model", "mlxlm_convert"} {
			if !r.Artifacts[a].Loaded || r.Artifacts[a].MTPParametersLoaded != 0 {
				t.Fatalf("mlx-lm %s, %s: loaded %v, %d MTP parameters", v, a, r.Artifacts[a].Loaded, r.Artifacts[a].MTPParametersLoaded)
			}
		}
		for _, pair := range []string{"side vs no_mtp", "side vs mlxlm_convert"} {
			if !r.Compare[pair].Identical {
				t.Fatalf("mlx-lm %s: %s not identical: %+v", v, pair, r.Compare[pair])
			}
		}
		runs[v] = r
	}
	if c := runs["0.31.3"].Compare["no_mtp vs mtp_in_model"]; c.Identical || c.MaxAbsDiff < 1 {
		t.Fatalf("the recorded run does not show v0.31.3's double shift: %+v", c)
	}

	out := t.TempDir()
	made := map[string]string{"side": filepath.Join(out, "mlx4-mtp-side"), "no_mtp": filepath.Join(out, "mlx4-no-mtp")}
	convertTo(t, qwen35Base, made["side"], QuantizeOptions{Bits: 4, GroupSize: 64, KeepMTP: true}, QuantizeRunOptions{Jobs: 2})
	convertTo(t, qwen35Base, made["no_mtp"], QuantizeOptions{Bits: 4, GroupSize: 64}, QuantizeRunOptions{Jobs: 2})
	loadedConfig := map[string]string{"side": "mlx4-mtp-side", "no_mtp": "mlx4-no-mtp"}
	for name, d := range made {
		rec := runs["0.32.0"].Artifacts[name].Files
		var want []string
		for f := range rec {
			want = append(want, f)
		}
		sort.Strings(want)
		if got := resFiles(t, d); !slices.Equal(got, want) {
			t.Errorf("%s: ferry writes %v, the device run loaded %v", name, got, want)
		}
		for _, v := range []string{"0.31.3", "0.32.0"} {
			for f, fr := range runs[v].Artifacts[name].Files {
				if fr != rec[f] {
					t.Errorf("%s/%s: mlx-lm %s and 0.32.0 loaded different files", name, f, v)
				}
			}
		}
		for f, fr := range rec {
			b := mustRead(t, filepath.Join(d, f))
			if f == "config.json" {
				// The copy kept of what was loaded, checked against the
				// run's digest, then compared up to ferry's reasons.
				kept := mustRead(t, filepath.Join(dir, "loaded", loadedConfig[name], f))
				if sha256hex(kept) != fr.SHA256 {
					t.Fatalf("%s: loaded/%s/config.json is not the file the run loaded", dir, loadedConfig[name])
				}
				if a, b := withoutReasons(t, b), withoutReasons(t, kept); a != b {
					t.Errorf("%s/config.json differs from the one the device run loaded:\n%s\nloaded:\n%s", name, a, b)
				}
				continue
			}
			if f == safetensors.IndexName {
				// Written since as mlx-lm writes it (metadata in
				// total_size, total_parameters order; the run loaded it
				// with keys sorted, Go's order then): the same content,
				// which mlx-lm's loader does not read (it globs
				// model*.safetensors). Re-encoded as then, it must be the
				// bytes loaded.
				b = sortedIndent4(t, b)
			}
			if got := sha256hex(b); got != fr.SHA256 {
				t.Errorf("%s/%s: sha256 %s, but the device run loaded %s: ferry's output is no longer what mlx-lm was shown to load (testdata/mlx_sidefile/PROVENANCE.md: run it again)", name, f, got, fr.SHA256)
			}
		}
	}
}

// sortedIndent4 re-encodes a JSON object as ferry wrote indexes before
// they followed mlx-lm's key order: keys sorted at every level, four-space
// indent, no final newline.
func sortedIndent4(t *testing.T, b []byte) []byte {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v map[string]any
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "    ")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n"))
}

func sha256hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// withoutReasons renders a config.json with the "reason" of ferry's MTP
// records left out: their wording is not something mlx-lm reads.
func withoutReasons(t *testing.T, b []byte) string {
	t.Helper()
	var c map[string]any
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{MTPSideKey, MTPRecordKey} {
		if rec, ok := c[k].(map[string]any); ok {
			delete(rec, "reason")
		}
	}
	out, _ := json.MarshalIndent(c, "", " ")
	return string(out)
}
