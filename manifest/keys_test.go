package manifest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCanonicalJSON(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"b":1,"a":{"d":[{"z":1,"y":2}],"c":null}}`, `{"a":{"c":null,"d":[{"y":2,"z":1}]},"b":1}`},
		{" { \"x\" : 9007199254740993 ,\n \"w\": 1.50 } ", `{"w":1.50,"x":9007199254740993}`},
		{`"s"`, `"s"`},
		{`[3,1]`, `[3,1]`},
	} {
		got, err := CanonicalJSON([]byte(tc.in))
		if err != nil || string(got) != tc.want {
			t.Errorf("CanonicalJSON(%s) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{``, `{`, `{"a":1} {"b":2}`, `{"a":1}x`} {
		if got, err := CanonicalJSON([]byte(bad)); err == nil {
			t.Errorf("CanonicalJSON(%q) = %s, want an error", bad, got)
		}
	}
}

// A source-keyed record's key holds its params without the path, and its
// outputs' digest; a stage key holds no release version: both only change
// with what decides the bytes.
func TestKeys(t *testing.T) {
	d1, d2 := DigestOf([]byte("1")), DigestOf([]byte("2"))
	must := func(k string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	a := must(SourceKey("import", "1", []byte(`{"path":"/a/model","copy":true}`), d1))
	if b := must(SourceKey("import", "1", []byte(`{"copy":true,"path":"/elsewhere/model"}`), d1)); b != a {
		t.Errorf("the path is in the source key")
	}
	for name, k := range map[string]string{
		"outputs": must(SourceKey("import", "1", []byte(`{"path":"/a/model","copy":true}`), d2)),
		"params":  must(SourceKey("import", "1", []byte(`{"path":"/a/model"}`), d1)),
		"version": must(SourceKey("import", "2", []byte(`{"path":"/a/model","copy":true}`), d1)),
	} {
		if k == a {
			t.Errorf("other %s, same source key", name)
		}
	}
	s := must(StageKey("gguf", "1", []byte(`{"outtype":"f16","from":"m"}`), []Digest{d1}))
	if s2 := must(StageKey("gguf", "1", []byte(`{"from":"m","outtype":"f16"}`), []Digest{d1})); s2 != s {
		t.Errorf("key order changes the stage key")
	}
	if n1, n2 := must(StageKey("x", "1", []byte(`{}`), nil)), must(StageKey("x", "1", []byte(`{}`), []Digest{})); n1 != n2 {
		t.Errorf("no inputs: nil and empty differ")
	}
	if len(s) != 64 || strings.Trim(s, "0123456789abcdef") != "" {
		t.Errorf("key %q is not 64 hex digits", s)
	}
}

// A format-1 manifest converts in memory: records re-keyed (an import by
// what it imported, its path dropped from its params), two records the old
// keys told apart by ferry's version alone become one (the one a pipeline
// points at), inputs and pipelines follow; SaveUpgrade writes it once.
func TestUpgradeV1(t *testing.T) {
	d := DigestOf([]byte("x"))
	imp := Output{Path: "config.json", Digest: d, Size: 1}
	v1 := `{"version":1,"records":{
 "ki":{"key":"ki","pipeline":"p","stage":"base","kind":"import","ferry_version":"0.1.0","kind_version":"1",
  "params":{"path":"/models/a","copy":true},"sources":{"/models/a/config.json":{"size":1,"mtime_ns":5,"inode":7}},
  "outputs":[{"path":"config.json","digest":"` + string(d) + `","size":1}]},
 "k1":{"key":"k1","pipeline":"p","stage":"g","kind":"gguf","ferry_version":"0.1.0","kind_version":"1",
  "params":{"outtype":"f16","from":"base"},"inputs":[{"stage":"base","key":"ki","digest":"` + string(OutputsDigest([]Output{imp})) + `"}],
  "outputs":[],"finished":"2026-01-01T00:00:00Z"},
 "k2":{"key":"k2","pipeline":"q","stage":"g","kind":"gguf","ferry_version":"0.2.0","kind_version":"1",
  "params":{"from":"base","outtype":"f16"},"inputs":[{"stage":"base","key":"ki","digest":"` + string(OutputsDigest([]Output{imp})) + `"}],
  "outputs":[],"finished":"2026-02-01T00:00:00Z"}},
 "pipelines":{"p":{"base":"ki","g":"k1"}},"blobs":{}}`
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "manifest.json"), []byte(v1), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Load(root)
	if err != nil {
		t.Fatal(err)
	}
	ik, err := SourceKey("import", "1", []byte(`{"copy":true}`), OutputsDigest([]Output{imp}))
	if err != nil {
		t.Fatal(err)
	}
	gk, err := StageKey("gguf", "1", []byte(`{"from":"base","outtype":"f16"}`), []Digest{OutputsDigest([]Output{imp})})
	if err != nil {
		t.Fatal(err)
	}
	recs := s.Records()
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2", len(recs))
	}
	base, g := s.StageRecord("p", "base"), s.StageRecord("p", "g")
	switch {
	case base == nil || base.Key != ik || string(base.Params) != `{"copy":true}` || len(base.Sources) != 1:
		t.Errorf("import record %+v, want key %s, params without the path, its sources", base, ik)
	case g == nil || g.Key != gk || g.FerryVersion != "0.1.0" || g.Inputs[0].Key != ik:
		t.Errorf("gguf record %+v, want key %s, the one pipeline p points at, input key %s", g, gk, ik)
	}
	if err := s.SaveUpgrade(); err != nil {
		t.Fatal(err)
	}
	// Format 3: the import's record stays in manifest.json, the gguf
	// one is a record object with a ref.
	b, _ := os.ReadFile(filepath.Join(root, "manifest.json"))
	if !strings.Contains(string(b), `"version": 3`) || strings.Contains(string(b), `"k1"`) || !strings.Contains(string(b), ik) || strings.Contains(string(b), gk) {
		t.Errorf("saved manifest is not the converted one:\n%s", b)
	}
	if ref, err := os.ReadFile(filepath.Join(root, "refs", "pipelines", "p", "g")); err != nil || strings.TrimSpace(string(ref)) != gk {
		t.Errorf("ref of p/g: %q %v, want %s", ref, err, gk)
	}
	if _, err := os.Stat(filepath.Join(root, "records", gk+".json")); err != nil {
		t.Errorf("the gguf record object: %v", err)
	}
	if s2, err := Load(root); err != nil || s2.upgraded || s2.StageRecord("p", "g").Key != gk {
		t.Errorf("reloaded: %v", err)
	}
}
