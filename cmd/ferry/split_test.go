package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/digest"
)

// The Qwen3.5 vision-language checkpoint and llama-gguf-split's parts of
// its conversions (gguf/testdata/split: PROVENANCE.md).
const (
	bundledVL     = "../../testdata/models/qwen35vl-tiny/base"
	splitGoldens  = "../../gguf/testdata/split"
	refF16Whole   = "694db159dfae9b5a0c5a458e5266c0f37ffdc1421c370ac5af9fe2d2064e92b2"
	refQ4KMWhole  = "a6be9aec150715da0448c1813ec4714a4ce929ca9d3a7b2887347d93db94baef"
	splitF16Stem  = "base-F16-size2M"
	splitQ4KMStem = "base-Q4_K_M-t20"
)

func splitSums(t *testing.T) map[string]string {
	t.Helper()
	ds, err := digest.ReadSums(filepath.Join(splitGoldens, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	sums := map[string]string{}
	for name, d := range ds {
		sums[name] = d.String()
	}
	return sums
}

// TestSplitCLI: gguf convert and quantize write llama-gguf-split's parts
// directly; inspect, verify mtp and quantize take the first part as the
// whole model (the MTP head is in the last part); a missing part, or a
// later part given first, is a bad-input error naming the file.
func TestSplitCLI(t *testing.T) {
	sums := splitSums(t)
	dir := t.TempDir()
	r := execFerry(t, nil, "gguf", "convert", "--json", "--split-max-size", "2M", "--out", filepath.Join(dir, splitF16Stem+".gguf"), bundledVL)
	if r.code != 0 {
		t.Fatalf("gguf convert: exit %d: %s", r.code, r.stderr)
	}
	var conv ggufConvertResult
	if err := json.Unmarshal([]byte(r.stdout), &conv); err != nil {
		t.Fatal(err)
	}
	if len(conv.Files) != 3 {
		t.Fatalf("convert files %v, want 3 parts", conv.Files)
	}
	var total int64
	for _, f := range conv.Files {
		if got := "sha256:" + fileDigest(t, f).Hex(); got != sums[filepath.Base(f)] {
			t.Errorf("%s: %s, llama-gguf-split's %s", filepath.Base(f), got, sums[filepath.Base(f)])
		}
		st, _ := os.Stat(f)
		total += st.Size()
	}
	if conv.Bytes != total {
		t.Errorf("convert says %d bytes, the parts hold %d", conv.Bytes, total)
	}
	first := conv.Files[0]

	// Every part named, as a shell glob names them: the later parts are
	// checked through the first, not refused.
	r = execFerry(t, nil, append([]string{"verify", "mtp"}, conv.Files...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "part 3 of 3, checked as part of "+first) {
		t.Errorf("verify mtp of every part: exit %d, stdout %s, stderr %s", r.code, r.stdout, r.stderr)
	}

	r = execFerry(t, nil, "quantize", "--json", "--split-max-tensors", "20", first, filepath.Join(dir, splitQ4KMStem+".gguf"), "Q4_K_M")
	if r.code != 0 {
		t.Fatalf("quantize: exit %d: %s", r.code, r.stderr)
	}
	var q quantizeResult
	if err := json.Unmarshal([]byte(r.stdout), &q); err != nil {
		t.Fatal(err)
	}
	if len(q.Files) != 4 {
		t.Fatalf("quantize files %v, want 4 parts", q.Files)
	}
	for _, f := range q.Files {
		got, _ := os.ReadFile(f)
		want, _ := os.ReadFile(filepath.Join(splitGoldens, filepath.Base(f)))
		if len(want) == 0 || !bytes.Equal(got, want) {
			t.Errorf("%s is not llama-gguf-split's part", filepath.Base(f))
		}
	}

	rep := inspectJSON(t, first)
	if rep.Summary.Tensors != 71 || rep.Summary.Shards != 3 || len(rep.Summary.ShardFiles) != 3 || !rep.Summary.MTP.Present || rep.Summary.MTP.NextNTensors != 15 {
		t.Errorf("inspect summary %+v", rep.Summary)
	}
	for _, row := range rep.Tensors {
		if strings.HasPrefix(row.Name, "blk.4.nextn.") && row.Shard != splitF16Stem+"-00003-of-00003.gguf" {
			t.Errorf("inspect: %s in %s, want the last part", row.Name, row.Shard)
		}
	}
	for _, kv := range rep.Metadata {
		if strings.HasPrefix(kv.Key, "split.") {
			t.Errorf("inspect lists %s", kv.Key)
		}
	}

	r = execFerry(t, nil, "verify", "mtp", first)
	if r.code != exitOK || !strings.Contains(r.stdout, "15/15") {
		t.Errorf("verify mtp of the first part: exit %d: %s%s", r.code, r.stdout, r.stderr)
	}

	// The parts are a whole again: quantized unsplit, llama-quantize's file.
	whole := filepath.Join(dir, "base-Q4_K_M.gguf")
	if r = execFerry(t, nil, "quantize", first, whole, "Q4_K_M"); r.code != 0 {
		t.Fatalf("quantize unsplit: exit %d: %s", r.code, r.stderr)
	}
	if got := "sha256:" + fileDigest(t, whole).Hex(); got != "sha256:"+refQ4KMWhole {
		t.Errorf("Q4_K_M of the split F16: %s, llama-quantize's %s", got, refQ4KMWhole)
	}

	// A later part given first, then a part missing.
	for _, c := range []struct {
		name  string
		setup func()
		args  []string
		want  []string
	}{
		{"later part", nil, []string{"inspect", conv.Files[1]}, []string{filepath.Base(conv.Files[1]), "open its first part, " + filepath.Base(first)}},
		{"missing part", func() { os.Remove(conv.Files[1]) }, []string{"verify", "mtp", first}, []string{filepath.Base(conv.Files[1]), "part 2 of 3 is missing"}},
		{"missing part, quantize", nil, []string{"quantize", first, filepath.Join(dir, "x.gguf"), "Q8_0"}, []string{filepath.Base(conv.Files[1]), "part 2 of 3 is missing"}},
		{"missing part, inspect", nil, []string{"inspect", first}, []string{filepath.Base(conv.Files[1]), "part 2 of 3 is missing"}},
	} {
		if c.setup != nil {
			c.setup()
		}
		r := execFerry(t, nil, c.args...)
		if r.code != exitBadInput {
			t.Errorf("%s: exit %d, want %d: %s", c.name, r.code, exitBadInput, r.stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(r.stderr+r.stdout, w) {
				t.Errorf("%s: %q not in %s%s", c.name, w, r.stdout, r.stderr)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "x.gguf")); err == nil {
		t.Error("quantize of a broken split wrote its output")
	}
}

// `ferry transfer` given the first part of a split sends every part; a
// part missing is a bad-input error naming it.
func TestTransferSplitParts(t *testing.T) {
	dir := t.TempDir()
	part := func(k int) string { return filepath.Join(dir, fmt.Sprintf("m-%05d-of-00003.gguf", k)) }
	for k := 1; k <= 3; k++ {
		if err := os.WriteFile(part(k), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	other := filepath.Join(dir, "other.gguf")
	os.WriteFile(other, []byte("y"), 0o644)
	got, err := withSplitParts([]string{other, part(1), part(3)})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{other, part(1), part(2), part(3)}; !reflect.DeepEqual(got, want) {
		t.Errorf("sources %v, want %v", got, want)
	}
	if got, _ := withSplitParts([]string{part(2)}); !reflect.DeepEqual(got, []string{part(2)}) {
		t.Errorf("a later part alone: %v", got)
	}
	os.Remove(part(2))
	_, err = withSplitParts([]string{part(1)})
	if exitCode(err) != exitBadInput || err == nil || !strings.Contains(err.Error(), part(2)) {
		t.Errorf("a missing part: %v (exit %d)", err, exitCode(err))
	}
}
