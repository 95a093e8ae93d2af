package digest

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDigest(t *testing.T) {
	sum := sha256.Sum256([]byte("abc"))
	const hexSum = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	d := New(sum[:])
	if d != Of([]byte("abc")) || d.String() != "sha256:"+hexSum || d.Hex() != hexSum || d.Short() != hexSum[:12] {
		t.Fatalf("New/Of/Hex/Short: %q", d)
	}
	if got, err := FromHex(hexSum); err != nil || got != d {
		t.Errorf("FromHex: %q, %v", got, err)
	}
	if got, err := Parse(string(d)); err != nil || got != d {
		t.Errorf("Parse: %q, %v", got, err)
	}
	b, _ := json.Marshal(struct {
		D Digest `json:"digest"`
	}{d})
	if string(b) != `{"digest":"sha256:`+hexSum+`"}` {
		t.Errorf("JSON %s", b)
	}
	for _, bad := range []string{"", hexSum, "sha256:" + strings.ToUpper(hexSum), "sha256:" + hexSum[1:], "md5:" + hexSum, "sha256:" + hexSum + "0"} {
		if _, err := Parse(bad); !errors.Is(err, ErrBad) {
			t.Errorf("Parse(%q): %v", bad, err)
		}
	}
	for _, bad := range []string{"", "sha256:" + hexSum, hexSum[:63] + "g", "../" + hexSum[3:]} {
		if _, err := FromHex(bad); !errors.Is(err, ErrBad) {
			t.Errorf("FromHex(%q): %v", bad, err)
		}
	}
}

func TestReadSums(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "SHA256SUMS")
	h := strings.Repeat("ab", 32)
	os.WriteFile(p, []byte(h+"  a.gguf\n"+h+" *b.bin\n\n"), 0o644)
	sums, err := ReadSums(p)
	if err != nil || len(sums) != 2 || sums["a.gguf"].Hex() != h || sums["b.bin"].Hex() != h {
		t.Errorf("ReadSums: %v, %v", sums, err)
	}
	os.WriteFile(p, []byte("xyz  a.gguf\n"), 0o644)
	if _, err := ReadSums(p); err == nil || !strings.Contains(err.Error(), ":1:") {
		t.Errorf("a bad line: %v", err)
	}
}
