// Package layering holds the test that keeps ferry's package graph the shape
// ../shared/DESIGN.md (and docs/ARCHITECTURE.md) draws: formats never import
// pipeline or the CLI, nor each other except through tensor/ and the
// exceptions listed here with their reasons; manifest and transfer know no
// format; nothing imports the CLI.
package layering

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/ferry-llm/ferry"

type kind int

const (
	cli      kind = iota + 1 // cmd/...: may import anything, imported by nothing
	composer                 // pipeline: composes stages; only the CLI imports it
	tool                     // inspect: reads every format; only the CLI and pipeline import it
	format                   // one model format, or tensor/, the dtypes they share
	store                    // manifest, store, transfer: know no format
	helper                   // internal/...: know no format, store or stage
)

// layers classifies every package by its path (the longest listed prefix
// owns a package: gguf/internal/ggufcheck belongs to gguf). A new top-level
// package must be added here; a new package under a format belongs to the
// closest listed one.
var layers = map[string]kind{
	"cmd":           cli,
	"pipeline":      composer,
	"pipelines":     composer,
	"inspect":       tool,
	"safetensors":   format,
	"tensor":        format,
	"gguf":          format,
	"gguf/quant":    format,
	"gguf/convert":  format,
	"gguf/imatrix":  format,
	"gguf/quantize": format,
	"merge":         format,
	"mlxpack":       format,
	"verify":        format,
	"manifest":      store,
	"store":         store,
	"transfer":      store,
	"netcheck":      store,
	// internal/s3client is the S3 connection (settings, retries, error
	// kinds) that store/s3 and transfer's S3 destination share: transfer
	// and store are siblings that do not import each other, so what both
	// use lives below them.
	"internal": helper,
	// The family descriptors every format reads (names, layouts, MTP
	// convention, GGUF arch and its quantize rules, mlx-lm's sanitize as
	// data): below the formats, so it imports none.
	"internal/family": helper,
}

// exceptions are the deliberate imports across formats (and from helpers
// into formats), each with its reason. Importing tensor/ needs none.
var exceptions = map[[2]string]string{
	{"gguf", "gguf/quant"}:                "a GGUF tensor is sized by its ggml type, and the ggml types are gguf/quant's",
	{"gguf/convert", "gguf"}:              "the converter writes GGUF files",
	{"gguf/convert", "gguf/quant"}:        "the converter encodes into ggml types and takes a quant.Policy",
	{"gguf/convert", "safetensors"}:       "the converter reads Hugging Face safetensors checkpoints",
	{"gguf/imatrix", "gguf"}:              "llama-imatrix writes its matrices as GGUF files",
	{"gguf/imatrix", "gguf/quant"}:        "the in_sum2 and counts tensors must be ggml F32",
	{"gguf/quantize", "gguf"}:             "the quantizer reads and writes GGUF files",
	{"gguf/quantize", "gguf/quant"}:       "the quantizer encodes into ggml types chosen by quant.Mix",
	{"gguf/quantize", "gguf/imatrix"}:     "--imatrix reads llama-imatrix output to weight the quantization error",
	{"gguf/quantize", "gguf/convert"}:     "the quantizer reads a checkpoint as the F16 GGUF the converter would write",
	{"gguf/quantize", "safetensors"}:      "the quantizer opens the checkpoint it converts on the fly",
	{"merge", "safetensors"}:              "a merge reads a safetensors base and adapter and writes a safetensors checkpoint",
	{"mlxpack", "safetensors"}:            "an MLX checkpoint is safetensors shards plus config.json",
	{"verify", "safetensors"}:             "verify checks the files every stage writes, whatever made them",
	{"verify", "gguf"}:                    "verify checks the files every stage writes, whatever made them",
	{"verify", "gguf/quant"}:              "verify --deep decodes ggml block scales",
	{"internal/testmodel", "safetensors"}: "it writes the tiny checkpoints tests convert and merge",
	{"internal/testmodel", "gguf"}:        "it writes the large F16 GGUF inputs quantizer tests and benchmarks read",
	{"internal/testmodel", "gguf/quant"}:  "the GGUF inputs it writes name their ggml types",
}

// owner is the listed path that owns pkg (module-relative), or "".
func owner(pkg string) string {
	for p := pkg; p != "."; {
		if _, ok := layers[p]; ok {
			return p
		}
		i := strings.LastIndexByte(p, '/')
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return ""
}

// exceptionKey is the owner pair an exception is listed under: internal
// helpers are listed by their own package (internal/testmodel), formats by
// their owner.
func exceptionKey(pkg, dep string) [2]string {
	p := owner(pkg)
	if layers[p] == helper {
		p = pkg
	}
	return [2]string{p, owner(dep)}
}

// violation says why pkg must not import dep (both module-relative), or
// "" when it may. testOnly applies only the rules about who imports the
// CLI, pipeline and tools: tests may use other formats to make inputs.
func violation(pkg, dep string, testOnly bool) string {
	p, d := owner(pkg), owner(dep)
	if p == "" {
		return fmt.Sprintf("%s is not classified: add its top-level folder to layers in internal/layering/layering_test.go", pkg)
	}
	if d == "" {
		return fmt.Sprintf("%s is not classified: add its top-level folder to layers in internal/layering/layering_test.go", dep)
	}
	if p == d {
		return ""
	}
	pk, dk := layers[p], layers[d]
	switch {
	case dk == cli && pk != cli:
		return "nothing imports the CLI"
	case dk == composer && pk != cli:
		return "only the CLI imports pipeline: stages call the packages below it, not the other way"
	case dk == tool && pk != cli && pk != composer:
		return "only the CLI and pipeline import " + d
	}
	if testOnly {
		return ""
	}
	if _, ok := exceptions[exceptionKey(pkg, dep)]; ok {
		return ""
	}
	switch {
	case pk == format && dk == format && d != "tensor":
		return "a format imports another format only through tensor/ (or a listed exception with its reason)"
	case pk == store && (dk == format || dk == tool):
		return p + " knows no format"
	case p == "transfer" && d == "store" || p == "store" && d == "transfer":
		return "transfer and store do not import each other: what both use (the S3 client) lives under internal/ (internal/s3client)"
	case pk == helper && dk != helper && d != "tensor":
		return "internal helpers know no format, store or stage"
	}
	return ""
}

type pkgInfo struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// graph lists the module's packages with their imports, from go list.
func graph(t *testing.T) []pkgInfo {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the layering check needs the go command: %v", err)
	}
	dir, err := exec.Command(goBin, "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	cmd := exec.Command(goBin, "list", "-e", "-json=ImportPath,Imports,TestImports,XTestImports", "./...")
	cmd.Dir = strings.TrimSpace(string(dir))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []pkgInfo
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkgInfo
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages; the check would pass on nothing", len(pkgs))
	}
	return pkgs
}

func local(path string) (string, bool) {
	if path == module {
		return ".", true
	}
	return strings.CutPrefix(path, module+"/")
}

// TestLayering fails when an import breaks the layering, and when an
// exception is no longer used (so the list says what is true).
func TestLayering(t *testing.T) {
	used := map[[2]string]bool{}
	var bad []string
	for _, p := range graph(t) {
		pkg, ok := local(p.ImportPath)
		if !ok {
			continue
		}
		check := func(imports []string, testOnly bool) {
			for _, imp := range imports {
				dep, ok := local(imp)
				if !ok || dep == pkg {
					continue
				}
				if why := violation(pkg, dep, testOnly); why != "" {
					what := "imports"
					if testOnly {
						what = "has a test that imports"
					}
					bad = append(bad, fmt.Sprintf("%s %s %s: %s", pkg, what, dep, why))
				} else if !testOnly {
					used[exceptionKey(pkg, dep)] = true
				}
			}
		}
		check(p.Imports, false)
		check(p.TestImports, true)
		check(p.XTestImports, true)
	}
	for k, reason := range exceptions {
		if !used[k] {
			bad = append(bad, fmt.Sprintf("exception %s → %s (%s) is not used any more: remove it", k[0], k[1], reason))
		}
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Error(b)
	}
}

// TestViolation: the rules catch the imports DESIGN.md forbids and let the
// listed ones through.
func TestViolation(t *testing.T) {
	for _, tt := range []struct {
		pkg, dep string
		testOnly bool
		bad      bool
	}{
		{"gguf/convert", "tensor", false, false},
		{"gguf/convert", "gguf", false, false},
		{"gguf/convert", "internal/inputerr", false, false},
		{"gguf/convert", "manifest", false, false},
		{"gguf/convert", "merge", false, true},
		{"gguf/quant", "gguf/convert", false, true},
		{"gguf/quant", "gguf", false, true},
		{"gguf/quant", "merge", false, true},
		{"gguf/quant", "pipeline", false, true},
		{"gguf/quant", "cmd/ferry", false, true},
		{"gguf", "safetensors", false, true},
		{"gguf/internal/ggufcheck", "gguf", false, false},
		{"safetensors/safetensorstest", "safetensors", false, false},
		{"mlxpack", "gguf", false, true},
		{"mlxpack", "merge", false, true},
		{"merge", "pipeline", false, true},
		{"verify", "mlxpack", false, true},
		{"safetensors", "cmd/ferry", false, true},
		{"manifest", "gguf", false, true},
		{"manifest", "tensor", false, true},
		{"manifest", "pipeline", false, true},
		{"manifest", "internal/hashing", false, false},
		{"transfer", "safetensors", false, true},
		{"transfer/netcheck", "manifest", false, false},
		{"transfer", "store/s3", false, true},
		{"store/s3", "transfer", false, true},
		{"transfer", "internal/s3client", false, false},
		{"store/s3", "internal/s3client", false, false},
		{"internal/hashing", "manifest", false, true},
		{"internal/testmodel", "safetensors", false, false},
		{"internal/fsutil", "safetensors", false, true},
		{"gguf/quant", "internal/family", false, false},
		{"mlxpack", "internal/family", false, false},
		{"internal/family", "gguf", false, true},
		{"internal/family", "mlxpack", false, true},
		{"pipeline", "gguf/convert", false, false},
		{"pipeline", "cmd/ferry", false, true},
		{"cmd/ferry", "pipeline", false, false},
		{"verify", "gguf/convert", true, false}, // a test may make its input with another format
		{"verify", "pipeline", true, true},
		{"newthing", "tensor", false, true}, // unclassified
	} {
		if got := violation(tt.pkg, tt.dep, tt.testOnly) != ""; got != tt.bad {
			t.Errorf("%s → %s (test %v): violation %v, want %v (%s)", tt.pkg, tt.dep, tt.testOnly, got, tt.bad, violation(tt.pkg, tt.dep, tt.testOnly))
		}
	}
}
