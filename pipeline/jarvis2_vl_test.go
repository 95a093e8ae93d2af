package pipeline_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/sshdtest"
	"github.com/ferry-llm/ferry/internal/testmodel"
)

// pipelines/jarvis2.yaml on a vision-language base (a generated
// Qwen3_5ForConditionalGeneration with a vision tower, and a DoRA adapter
// on its language model): the merge keeps the tower, the f16 and quants
// stages write mmproj-<NAME>-F16.gguf beside their GGUFs (one blob), the
// gate passes with the mmproj among its inputs, and both hosts receive it
// next to the quants, with the store's digest. make demo-full runs it
// (FERRY_JARVIS2_VL=1), after the same file on the text-only example, where
// mmproj: auto writes nothing.
func TestJarvis2VisionLanguage(t *testing.T) {
	if os.Getenv("FERRY_JARVIS2_VL") == "" {
		t.Skip("FERRY_JARVIS2_VL not set: the whole jarvis2 flow on a vision-language base with two sshd servers, run by make demo-full")
	}
	set, err := testmodel.Qwen35VL(t.TempDir(), testmodel.Qwen35Options{Common: testmodel.Common{Seed: 21}})
	if err != nil {
		t.Fatal(err)
	}
	base, adapter := set.Base.Dir, set.AdapterDir
	a := sshdtest.Start(t, sshdtest.Alias("vl-a"))
	b := sshdtest.Start(t, sshdtest.Alias("vl-b"))
	home := t.TempDir()
	write(t, filepath.Join(home, ".ssh/config"), a.HostBlock("vl-a")+b.HostBlock("vl-b"))
	src, err := os.ReadFile("../pipelines/jarvis2.yaml")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "jarvis2.yaml")
	write(t, file, string(src))
	remote := filepath.Join(t.TempDir(), "remote")
	j := &jarvis2Run{t: t, file: file, remote: remote,
		env: []string{"HOME=" + home, "SSH_AUTH_SOCK="},
		vars: []string{
			"--var", "BASE=" + base, "--var", "ADAPTER=" + adapter, "--var", "NAME=Jarvis2-vl",
			"--var", "IMATRIX=", "--var", "QUANTS=Q8_0,Q4_K_M",
			"--var", "TARGETS=vl-a:" + remote + "/a/jarvis2,vl-b:" + remote + "/b/jarvis2",
		}}
	if r := ferryEnv(t, j.env, j.args("pipeline", "run")...); r.code != 0 {
		t.Fatalf("run: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	outs := j.outputs()
	const mm = "mmproj-Jarvis2-Vl-F16.gguf" // general.name: the converter title-cases the lower-case word
	digest := outs["f16/"+mm]
	if digest == "" || outs["quants/"+mm] != digest {
		t.Fatalf("f16 and quants should hold one %s: %v", mm, outs)
	}
	for k := range outs {
		if strings.HasPrefix(k, "mlx4/") && strings.Contains(k, "visual") {
			t.Errorf("%s", k)
		}
	}
	files := j.remoteFiles()
	for _, h := range []string{"a", "b"} {
		p := filepath.Join(h, "jarvis2", "quants", mm)
		if got := files[p]; "sha256:"+got != digest {
			t.Errorf("host %s: %s has sha256 %q, the store's %s", h, p, got, digest)
		}
	}
}
