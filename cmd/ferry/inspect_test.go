package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"

	"github.com/ferry-llm/ferry/inspect"
	"github.com/ferry-llm/ferry/internal/benchtest"
	"github.com/ferry-llm/ferry/internal/sysmem"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/safetensors/safetensorstest"
	"github.com/ferry-llm/ferry/tensor"
	"github.com/ferry-llm/ferry/verify"
)

const bundledBase = "../../testdata/models/qwen35-tiny/base"

// The test binary doubles as the ferry binary: with FERRY_INSPECT_TEST_AS_MAIN
// set it runs main with its arguments, so tests see real exit codes, stdout
// and stderr, and a separate process's resource usage.
func init() {
	if os.Getenv("FERRY_INSPECT_TEST_AS_MAIN") == "1" {
		os.Args = append([]string{"ferry"}, os.Args[1:]...)
		stop, err := benchtest.StartProfile() // a benchmark's ferry process
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		code := run()
		stop()
		os.Exit(code)
	}
}

type ferryRun struct {
	stdout, stderr string
	code           int
	maxRSSKiB      int64
}

// execFerry runs ferry as a child process.
func execFerry(t testing.TB, env []string, args ...string) ferryRun {
	t.Helper()
	return execFerryIn(t, "", env, args...)
}

// execFerryIn is execFerry in directory dir ("": the test's).
func execFerryIn(t testing.TB, dir string, env []string, args ...string) ferryRun {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "FERRY_INSPECT_TEST_AS_MAIN=1"), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := ferryRun{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("running ferry %v: %v", args, err)
	}
	r.maxRSSKiB = sysmem.PeakRSS(cmd.ProcessState) >> 10
	return r
}

func inspectJSON(t *testing.T, args ...string) inspect.Report {
	t.Helper()
	r := execFerry(t, nil, append([]string{"inspect", "--json"}, args...)...)
	if r.code != 0 {
		t.Fatalf("inspect %v: exit %d: %s", args, r.code, r.stderr)
	}
	var rep inspect.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("inspect --json output: %v\n%s", err, r.stdout)
	}
	return rep
}

func TestInspectBundled(t *testing.T) {
	rep := inspectJSON(t, bundledBase)
	s := rep.Summary
	if s.Tensors != 71 || len(rep.Tensors) != 71 {
		t.Errorf("%d tensors (%d rows), want 71", s.Tensors, len(rep.Tensors))
	}
	if s.Shards != 7 || len(s.ShardFiles) != 7 {
		t.Errorf("%d shards, want 7", s.Shards)
	}
	if s.Architecture != "Qwen3_5ForCausalLM" || s.ModelType != "qwen3_5_text" {
		t.Errorf("architecture %q model_type %q", s.Architecture, s.ModelType)
	}
	if !s.MTP.Present || s.MTP.Tensors != 15 || s.MTP.Promised != 1 || s.MTP.PromisedBy != "mtp_num_hidden_layers" {
		t.Errorf("mtp %+v, want 15 mtp.* tensors and 1 promised layer", s.MTP)
	}
	// The index's own totals, written by transformers.
	if s.Parameters != 3686616 || s.Bytes != 7373232 || s.BytesPerDType["BF16"] != 7373232 {
		t.Errorf("parameters %d bytes %d per dtype %v", s.Parameters, s.Bytes, s.BytesPerDType)
	}
	// Offsets are absolute: the bytes there are the tensor's bytes.
	ck, err := safetensors.OpenDir(bundledBase)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	for _, r := range rep.Tensors {
		l, ok := ck.Lookup(r.Name)
		if !ok || l.Shard.Name != r.Shard || !reflect.DeepEqual(l.Info.Shape, r.Shape) || string(l.Info.DType) != r.DType || l.Info.Size() != r.Bytes {
			t.Fatalf("row %+v disagrees with the checkpoint", r)
		}
		want, _ := io.ReadAll(l.Section())
		got := make([]byte, r.Bytes)
		f, _ := os.Open(filepath.Join(bundledBase, r.Shard))
		f.ReadAt(got, r.Offset)
		f.Close()
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: bytes at offset %d are not the tensor's", r.Name, r.Offset)
		}
	}

	text := execFerry(t, nil, "inspect", bundledBase)
	for _, want := range []string{"architecture  Qwen3_5ForCausalLM", "tensors       71", "shards        7", "mtp           present: 15 mtp.* tensors", "mtp.fc.weight"} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("text output lacks %q:\n%s", want, text.stdout)
		}
	}
	if lines := strings.Count(text.stdout, "\n"); lines != 12+71 {
		t.Errorf("text output has %d lines, want 12 summary + 71 rows", lines)
	}
}

// sha256 of each row's bytes, read independently of the hashing package.
func checkRowHashes(t *testing.T, dir string, rows []inspect.Row) {
	t.Helper()
	for _, r := range rows {
		f, err := os.Open(filepath.Join(dir, r.Shard))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		io.Copy(h, io.NewSectionReader(f, r.Offset, r.Bytes))
		f.Close()
		if got := hex.EncodeToString(h.Sum(nil)); r.SHA256 != got {
			t.Fatalf("%s: sha256 %s, want %s", r.Name, r.SHA256, got)
		}
	}
}

func TestInspectHash(t *testing.T) {
	var first []inspect.Row
	for _, jobs := range []string{"1", "3"} {
		r := execFerry(t, nil, "inspect", "--json", "--hash", "--jobs", jobs, bundledBase)
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		if r.stderr != "" {
			t.Errorf("stderr is not a terminal but got output: %q", r.stderr)
		}
		var rep inspect.Report
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
			t.Fatal(err)
		}
		checkRowHashes(t, bundledBase, rep.Tensors)
		if first == nil {
			first = rep.Tensors
		} else if !reflect.DeepEqual(first, rep.Tensors) {
			t.Error("rows differ between --jobs 1 and --jobs 3")
		}
	}
	text := execFerry(t, nil, "inspect", "--hash", bundledBase)
	if !strings.Contains(text.stdout, "SHA256") || !strings.Contains(text.stdout, first[0].SHA256) {
		t.Error("text output lacks the sha256 column")
	}
}

// parquetSchema is the Parquet schema inspect --parquet writes, as
// parquet-go prints what it reads (a plain int64 as INT(64,true)): Arrow's
// string, list<int64>, int64 and a nullable string.
const parquetSchema = `message schema {
	required binary name (STRING);
	required binary dtype (STRING);
	required group shape (LIST) {
		repeated group list {
			optional int64 element (INT(64,true));
		}
	}
	required int64 bytes (INT(64,true));
	required binary shard (STRING);
	required int64 offset (INT(64,true));
	optional binary sha256 (STRING);
}`

// readParquetRows reads the rows of an inspect --parquet file with
// parquet-go, a reader independent of the writer.
func readParquetRows(t *testing.T, p string) []inspect.Row {
	t.Helper()
	fh, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		t.Fatal(err)
	}
	f, err := parquet.OpenFile(fh, st.Size())
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	if got := f.Schema().String(); got != parquetSchema {
		t.Errorf("schema:\n%s\nwant:\n%s", got, parquetSchema)
	}
	var rows []inspect.Row
	for _, rg := range f.RowGroups() {
		rr := rg.Rows()
		buf := make([]parquet.Row, 64)
		for {
			n, err := rr.ReadRows(buf)
			for _, row := range buf[:n] {
				r := inspect.Row{Shape: []int64{}}
				for _, v := range row {
					switch v.Column() {
					case 0:
						r.Name = string(v.ByteArray())
					case 1:
						r.DType = string(v.ByteArray())
					case 2:
						if !v.IsNull() { // an empty list is one null leaf
							r.Shape = append(r.Shape, v.Int64())
						}
					case 3:
						r.Bytes = v.Int64()
					case 4:
						r.Shard = string(v.ByteArray())
					case 5:
						r.Offset = v.Int64()
					case 6:
						if !v.IsNull() {
							r.SHA256 = string(v.ByteArray())
						}
					}
				}
				rows = append(rows, r)
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		rr.Close()
	}
	return rows
}

func TestInspectParquet(t *testing.T) {
	for _, hash := range []bool{false, true} {
		dir := t.TempDir()
		p := filepath.Join(dir, "tensors.parquet")
		args := []string{"--parquet", p, bundledBase}
		if hash {
			args = append([]string{"--hash"}, args...)
		}
		rep := inspectJSON(t, args...)
		got := readParquetRows(t, p)
		if !reflect.DeepEqual(got, rep.Tensors) {
			t.Errorf("hash=%v: parquet rows differ from --json rows", hash)
		}
		if len(got) != 71 || (hash && got[0].SHA256 == "") || (!hash && got[0].SHA256 != "") {
			t.Errorf("hash=%v: %d rows, first sha256 %q", hash, len(got), got[0].SHA256)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 1 {
			t.Errorf("output directory holds %v, want just the parquet file", ents)
		}
	}
	// A bad destination is refused before any work (here before hashing),
	// exit 2, naming the destination.
	dir := t.TempDir()
	for _, dest := range []string{filepath.Join(dir, "no", "such", "dir.parquet"), dir} {
		r := execFerry(t, nil, "inspect", "--hash", "--parquet", dest, bundledBase)
		if r.code != exitBadInput || !strings.Contains(r.stderr, dest) || r.stdout != "" {
			t.Errorf("--parquet %s: exit %d, stderr %q, stdout %d bytes", dest, r.code, r.stderr, len(r.stdout))
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("wrote %v", ents)
	}
}

func TestInspectBadInput(t *testing.T) {
	for _, c := range safetensorstest.BadCases() {
		t.Run(c.Name, func(t *testing.T) {
			root := t.TempDir()
			p, err := c.Build(root)
			if err != nil {
				t.Fatal(err)
			}
			before, _ := safetensorstest.Snapshot(root)
			out := t.TempDir()
			pq := filepath.Join(out, "t.parquet")
			for _, args := range [][]string{{"inspect", p}, {"inspect", "--json", "--hash", "--parquet", pq, p}} {
				r := execFerry(t, nil, args...)
				if r.code != exitBadInput {
					t.Errorf("%v: exit %d, want 2; stderr %s", args, r.code, r.stderr)
				}
				if !strings.Contains(r.stderr, c.Blame) {
					t.Errorf("%v: stderr %q does not name %s", args, r.stderr, c.Blame)
				}
				// No result: nothing on stdout, or with --json the error
				// alone, as JSON.
				var e jsonError
				switch {
				case args[1] != "--json" && r.stdout != "":
					t.Errorf("%v: printed a result for bad input: %q", args, r.stdout)
				case args[1] == "--json" && (json.Unmarshal([]byte(r.stdout), &e) != nil || e.ExitCode != exitBadInput || !strings.Contains(e.Error, c.Blame)):
					t.Errorf("%v: stdout %q, want the error as JSON", args, r.stdout)
				}
			}
			after, _ := safetensorstest.Snapshot(root)
			if !reflect.DeepEqual(before, after) {
				t.Error("input changed")
			}
			if ents, _ := os.ReadDir(out); len(ents) != 0 {
				t.Errorf("wrote %v for bad input", ents)
			}
		})
	}
}

func TestInspectUsage(t *testing.T) {
	dir := t.TempDir()
	gguf := filepath.Join(dir, "model.bin")
	os.WriteFile(gguf, []byte("GGUF\x03\x00\x00\x00"), 0o644)
	tests := []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"no-such-command"}, exitBadInput, "no-such-command"},
		{[]string{"inspect", "--no-such-flag", bundledBase}, exitBadInput, "no-such-flag"},
		{[]string{"inspect"}, exitBadInput, "PATH"},
		{[]string{"inspect", bundledBase, bundledBase}, exitBadInput, "PATH"},
		// Flags may follow PATH (interspersed moves them in front).
		{[]string{"inspect", bundledBase, "--json"}, exitOK, ""},
		{[]string{"merge", "--no-such-flag"}, exitBadInput, "no-such-flag"},
		{[]string{"inspect", "--jobs", "0", bundledBase}, exitBadInput, "--jobs"},
		{[]string{"inspect", filepath.Join(dir, "missing")}, exitBadInput, "missing"},
		// The GGUF magic routes to the GGUF inspector (a truncated GGUF
		// here), not to the safetensors parser.
		{[]string{"inspect", gguf}, exitBadInput, "model.bin"},
		{[]string{"inspect", filepath.Join(dir, "x.gguf")}, exitBadInput, "x.gguf"},
	}
	for _, tt := range tests {
		r := execFerry(t, nil, tt.args...)
		if r.code != tt.code || !strings.Contains(r.stderr, tt.stderr) {
			t.Errorf("%v: exit %d stderr %q, want exit %d mentioning %q", tt.args, r.code, r.stderr, tt.code, tt.stderr)
		}
		if strings.Contains(r.stderr, "model.bin") && strings.Contains(r.stderr, "header length") {
			t.Errorf("%v: a GGUF file went to the safetensors parser: %s", tt.args, r.stderr)
		}
	}
}

func TestInspectFileAndAdapter(t *testing.T) {
	shard := filepath.Join(bundledBase, "model-00007-of-00007.safetensors")
	rep := inspectJSON(t, shard)
	if rep.Summary.Shards != 1 || rep.Summary.MTP.Tensors != 15 || rep.Summary.Architecture != "Qwen3_5ForCausalLM" {
		t.Errorf("single shard: %+v", rep.Summary)
	}
	for _, r := range rep.Tensors {
		if r.Shard != "model-00007-of-00007.safetensors" {
			t.Fatalf("row shard %q", r.Shard)
		}
	}
	ad := inspectJSON(t, "../../testdata/models/qwen35-tiny/adapter-dora")
	if ad.Summary.Tensors != 93 || ad.Summary.BytesPerDType["F32"] != ad.Summary.Bytes || ad.Summary.MTP.Present {
		t.Errorf("adapter: %+v", ad.Summary)
	}
}

// DeepSeek-style MTP: layers past num_hidden_layers, counted when the
// config sets num_nextn_predict_layers.
func TestInspectNextN(t *testing.T) {
	dir := t.TempDir()
	specs := []safetensors.TensorSpec{
		safetensorstest.Spec("model.embed_tokens.weight", tensor.BF16, 8, 4),
		safetensorstest.Spec("model.layers.0.mlp.down_proj.weight", tensor.BF16, 4, 4),
		safetensorstest.Spec("model.layers.1.eh_proj.weight", tensor.BF16, 4, 8),
		safetensorstest.Spec("model.layers.1.enorm.weight", tensor.BF16, 4),
		safetensorstest.Spec("model.layers.1.mlp.down_proj.weight", tensor.BF16, 4, 4),
	}
	if err := safetensorstest.WriteFile(filepath.Join(dir, "model.safetensors"), specs...); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"architectures":["DeepseekV3ForCausalLM"],"model_type":"deepseek_v3","num_hidden_layers":1,"num_nextn_predict_layers":1}`), 0o644)
	m := inspectJSON(t, dir).Summary.MTP
	if !m.Present || m.Tensors != 0 || m.NextNTensors != 3 || !reflect.DeepEqual(m.NextNLayers, []int{1}) || m.Promised != 1 || m.PromisedBy != "num_nextn_predict_layers" {
		t.Errorf("mtp %+v", m)
	}
	// The same checkpoint with the promise but without the layer.
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"num_hidden_layers":2,"num_nextn_predict_layers":1}`), 0o644)
	m = inspectJSON(t, dir).Summary.MTP
	if m.Present || m.Promised != 1 {
		t.Errorf("mtp %+v, want absent but promised", m)
	}
	text := execFerry(t, nil, "inspect", dir)
	if !strings.Contains(text.stdout, "mtp           none (config promises 1 via num_nextn_predict_layers)") {
		t.Errorf("text: %s", text.stdout)
	}
}

// --follow-links accepts a shard symlinked out of the directory, which is
// refused (exit 2) without it.
func TestInspectFollowLinks(t *testing.T) {
	for _, c := range safetensorstest.BadCases() {
		if c.Want != safetensors.ErrSymlinkOutside {
			continue
		}
		dir, err := c.Build(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if r := execFerry(t, nil, "inspect", dir); r.code != exitBadInput {
			t.Errorf("without --follow-links: exit %d", r.code)
		}
		rep := inspectJSON(t, "--follow-links", dir)
		if rep.Summary.Tensors != 4 || rep.Summary.Shards != 2 {
			t.Errorf("with --follow-links: %+v", rep.Summary)
		}
		return
	}
	t.Fatal("no symlink case in the bad-input table")
}

// TestInspectMLXParameters: on an MLX directory inspect counts parameters as
// mlx-lm's total_parameters does, the figure the index records (ferry's
// index matches mlx_lm.convert's: mlxpack's golden tests), not the packed
// U32 words (it said 460440 for a 3.69 M model), and says so; on a Hugging
// Face checkpoint it counts elements.
func TestInspectMLXParameters(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"4-bit", []string{"--bits", "4"}},
		{"4-bit with the head", []string{"--bits", "4", "--keep-mtp"}},
		{"3-bit group 32", []string{"--bits", "3", "--group-size", "32"}},
		{"mixed_3_6", []string{"--bits", "3", "--recipe", "mixed_3_6"}},
		{"8-bit lm_head at 4", []string{"--bits", "8", "--module-bits", "lm_head=4"}},
		{"float", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
			if _, code, err := runFerry(t, append([]string{"mlx", "quantize", bundledBase, "--out", out}, tc.args...)...); code != exitOK {
				t.Fatalf("mlx quantize: exit %d: %v", code, err)
			}
			var idx struct {
				Metadata struct {
					TotalParameters int64 `json:"total_parameters"`
				} `json:"metadata"`
			}
			b, _ := os.ReadFile(filepath.Join(out, safetensors.IndexName))
			if err := json.Unmarshal(b, &idx); err != nil {
				t.Fatal(err)
			}
			s := inspectJSON(t, out).Summary
			if s.Parameters != idx.Metadata.TotalParameters || s.ParameterRule != verify.RuleMLX {
				t.Errorf("parameters %d (%s), the index's total_parameters %d", s.Parameters, s.ParameterRule, idx.Metadata.TotalParameters)
			}
			text, _, _ := runFerry(t, "inspect", out)
			if !strings.Contains(text, fmt.Sprintf("parameters    %d (as mlx-lm's total_parameters counts them", idx.Metadata.TotalParameters)) {
				t.Errorf("text output:\n%s", text[:min(len(text), 600)])
			}
		})
	}
	if s := inspectJSON(t, bundledBase).Summary; s.ParameterRule != verify.RuleElements {
		t.Errorf("a Hugging Face checkpoint: parameter rule %q", s.ParameterRule)
	}
}
