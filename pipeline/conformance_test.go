package pipeline_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/sshdtest"
	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/manifest"

	"github.com/ferry-llm/ferry/pipeline/pipelinetest"

	. "github.com/ferry-llm/ferry/pipeline" // an external test package: pipelinetest imports pipeline
)

// Every built stage kind runs this suite: outputs are deterministic and do
// not depend on where the store or views live; a run cancelled partway and
// resumed ends with the same outputs; a second run skips everything; and a
// changed parameter changes the key.
func TestStageConformance(t *testing.T) {
	models, _ := filepath.Abs("../testdata/models/qwen35-tiny")
	ggufIn, _ := filepath.Abs("../gguf/quant/testdata/qwen35-base-F16.gguf")
	ctDir := filepath.Join(t.TempDir(), "ct")
	if err := testmodel.CompressedDeepSeekV3(3).Write(ctDir); err != nil {
		t.Fatal(err)
	}
	remote := t.TempDir()
	imports := `  - name: base
    import: { path: ` + models + `/base }
  - name: adapter
    import: { path: ` + models + `/adapter-dora }
  - name: ct
    import: { path: ` + ctDir + ` }
  - name: g
    import: { path: ` + ggufIn + ` }
`
	cases := []struct {
		kind, stage, alt string // alt: the stage with one parameter changed
	}{
		// An import's path is not a parameter of its key (it is keyed by
		// the files it read): copy is.
		{"import", `import: { path: ` + models + `/adapter-dora }`, `import: { path: ` + models + `/adapter-dora, copy: true }`},
		{"synth", `synth: { size: 3MiB, units: 6, seed: 1, from: base }`, `synth: { size: 3MiB, units: 6, seed: 2, from: base }`},
		{"merge", `merge: { base: base, adapter: adapter }`, `merge: { base: base, adapter: adapter, dtype: f32 }`},
		{"gguf", `gguf: { from: base, outtype: f16 }`, `gguf: { from: base, outtype: bf16 }`},
		{"verify_mtp", `verify_mtp: { from: [base], require: true }`, `verify_mtp: { from: [base], require: false }`},
		{"mlx_repack", `mlx_repack: { from: ct }`, `mlx_repack: { from: ct, rewrite: true }`},
		{"quantize", `quantize: { from: g, type: Q4_K_M }`, `quantize: { from: g, type: Q6_K }`},
		{"mlx_quantize", `mlx_quantize: { from: base, bits: 4, group_size: 64 }`, `mlx_quantize: { from: base, bits: 4, group_size: 32 }`},
		// To the test sshd (started in the subtest, named in a ~/.ssh/config).
		{"transfer", `transfer: { from: [adapter], to: [conformance:` + remote + `/a] }`, `transfer: { from: [adapter], to: [conformance:` + remote + `/b] }`},
	}
	covered := map[string]bool{}
	for _, tc := range cases {
		covered[tc.kind] = true
		t.Run(tc.kind, func(t *testing.T) {
			if tc.kind == "transfer" {
				sshdHome(t, "conformance")
			}
			mk := func(dir, stage, out string) *Spec {
				return loadSpec(t, dir, "name: c\nstages:\n"+imports+"  - name: x\n    "+stage+"\n"+out)
			}
			outputs := func(rep *Report) []manifest.Output {
				return rep.Stages[len(rep.Stages)-1].Outputs
			}
			// Reference run.
			a := mk(t.TempDir(), tc.stage, "")
			repA, err := Run(context.Background(), a, Options{Stages: 2, Workers: 2})
			if err != nil {
				t.Fatal(err)
			}
			want := manifest.OutputsDigest(outputs(repA))
			if len(outputs(repA)) == 0 {
				t.Fatal("no outputs")
			}
			// Its bytes change only with its kind's Version.
			pin := want
			if tc.kind == "transfer" {
				store, err := manifest.Load(a.Store)
				if err != nil {
					t.Fatal(err)
				}
				if pin, err = transferPinDigest(store, outputs(repA)); err != nil {
					t.Fatal(err)
				}
			}
			checkKindPin(t, tc.kind, pin)
			// Another store, an out: view elsewhere, one worker.
			b := mk(t.TempDir(), tc.stage, "    out: somewhere/else\n")
			repB, err := Run(context.Background(), b, Options{Stages: 1, Workers: 1})
			if err != nil {
				t.Fatal(err)
			}
			if got := manifest.OutputsDigest(outputs(repB)); got != want {
				t.Errorf("outputs depend on the store, view or job count: %v vs %v", outputs(repB), outputs(repA))
			}
			// Cancelled partway (where the stage reports progress), resumed.
			c := mk(t.TempDir(), tc.stage, "")
			if _, err := Run(context.Background(), c, Options{Only: "base"}); err != nil {
				t.Fatal(err)
			}
			for _, dep := range []string{"adapter", "ct", "g"} {
				if _, err := Run(context.Background(), c, Options{Only: dep}); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			prog := &cancelAfter{n: 256 << 10, cancel: cancel}
			repX, err := Run(ctx, c, Options{Only: "x", Progress: func(string) Progress { return prog }})
			cancel()
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled run: %v", err)
			}
			if err != nil {
				// The cancel came while the stage ran: it is interrupted,
				// in the report and in status, whatever its kind.
				t.Logf("cancelled while it ran: %v", err)
				if a := repX.Stages[len(repX.Stages)-1].Action; a != ActionInterrupted {
					t.Errorf("cancelled stage: action %s, want interrupted (%v)", a, err)
				}
				st, serr := Status(c)
				if serr != nil {
					t.Fatal(serr)
				}
				if s := st.Stages[len(st.Stages)-1]; s.State != StateInterrupted {
					t.Errorf("status of the cancelled stage: %s %s, want interrupted", s.State, s.Detail)
				}
			}
			repC, err := Run(context.Background(), c, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if got := manifest.OutputsDigest(outputs(repC)); got != want {
				t.Errorf("cancelled and resumed: outputs differ")
			}
			// A second run skips everything.
			rep, err := Run(context.Background(), c, Options{})
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range rep.Stages {
				if s.Action != ActionSkip {
					t.Errorf("second run: %s %s (%s)", s.Stage, s.Action, s.Reason)
				}
			}
			// A changed parameter is a different key: plan says so.
			d := mk(c.Dir, tc.alt, "")
			pr, err := Plan(d, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if last := pr.Stages[len(pr.Stages)-1]; last.Action != ActionRun || !strings.Contains(last.Reason, "parameters changed") {
				t.Errorf("plan with a changed parameter: %s %s", last.Action, last.Reason)
			}
		})
	}
	kinds := pipelinetest.Kinds()
	for _, kind := range kinds.Names() {
		if k, _ := kinds.Lookup(kind); k.Built() && !covered[kind] {
			t.Errorf("built kind %q is not in the conformance suite", kind)
		}
	}
}

// sshdHome starts the test sshd and makes it reachable as host through a
// ~/.ssh/config in a HOME of the test's own (no agent). Its sessions get a
// HOME of their own too, so remote commands do not source the machine's
// shell rc files (a ~/.bashrc initialising pyenv cost 5 s per command).
func sshdHome(t *testing.T, host string) *sshdtest.Server {
	s := sshdtest.Start(t, sshdtest.SSHDConfig("SetEnv HOME="+t.TempDir()))
	home := t.TempDir()
	if err := os.MkdirAll(filepath.Join(home, ".ssh"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(home, ".ssh", "config"), s.HostBlock(host))
	t.Setenv("HOME", home)
	t.Setenv("SSH_AUTH_SOCK", "")
	return s
}
