package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/convert"
	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/inputerr"
	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/merge"
	"github.com/ferry-llm/ferry/mlxpack"
	"github.com/ferry-llm/ferry/pipeline"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/verify"
)

// One table over errors from every package, made by the packages
// themselves where a bad input is cheap to make: each lands in its kind
// and the kind in its documented exit code.
func TestExitCodeTable(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.bin")
	if err := os.WriteFile(junk, []byte("not a model file at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	badYAML := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(badYAML, []byte("name: p\nstages: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(dir, "ok.yaml")
	if err := os.WriteFile(spec, []byte("name: p\nstages:\n  - name: m\n    import: { path: empty }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	must := func(_ any, err error) error {
		if err == nil {
			t.Fatal("expected an error")
		}
		return err
	}

	// A record whose blob vanished before the commit: damage.
	store, err := manifest.Open(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("gone"))
	blobGone := store.Commit(&manifest.Record{Key: "k", Pipeline: "p", Stage: "s", Kind: "import",
		Outputs: []manifest.Output{{Path: "x.bin", Digest: manifest.NewDigest(sum[:]), Size: 4}}})

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	pspec, err := pipeline.Load(spec)
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		err  error
		kind errkind.Kind
		code int
	}{
		{"plain failure", errors.New("disk on fire"), errkind.Failure, exitFailure},
		{"usage (cli)", usageErrorf("--jobs must be at least 1"), errkind.Usage, exitBadInput},
		{"usage (pipeline --only)", must(pipeline.Run(context.Background(), pspec, pipeline.Options{Only: "nope"})), errkind.Usage, exitBadInput},
		{"missing path", must(os.Open(filepath.Join(dir, "nope"))), errkind.BadInput, exitBadInput},
		{"safetensors header", must(safetensors.Open(junk)), errkind.BadInput, exitBadInput},
		{"safetensors checkpoint", must(safetensors.OpenDir(empty)), errkind.BadInput, exitBadInput},
		{"gguf magic", must(gguf.Open(junk)), errkind.BadInput, exitBadInput},
		{"convert arch", &convert.Error{Path: "config.json", Offset: -1, Err: convert.ErrUnsupportedArch}, errkind.BadInput, exitBadInput},
		{"merge adapter", must(merge.Inventory(empty, empty, merge.PlanOptions{})), errkind.BadInput, exitBadInput},
		{"mlxpack source", must(mlxpack.PlanRepack(empty, mlxpack.Options{})), errkind.BadInput, exitBadInput},
		{"mlxpack layout not built", inputerr.New("model.safetensors", "experts", -1, errkind.ErrNotBuilt, "fused"), errkind.NotBuilt, exitFailure},
		{"verify not a model", must(verify.MTP(junk, verify.Options{})), errkind.BadInput, exitBadInput},
		{"verify missing path", must(verify.MTP(filepath.Join(dir, "nope"), verify.Options{})), errkind.BadInput, exitBadInput},
		{"pipeline file", must(pipeline.Load(badYAML)), errkind.BadInput, exitBadInput},
		{"mlx quantize without SRC", must(nil, newApp().Run([]string{"ferry", "mlx", "quantize"})), errkind.Usage, exitBadInput},
		{"verify PATH not built", must(nil, newApp().Run([]string{"ferry", "verify", "x"})), errkind.NotBuilt, exitFailure},
		{"pipeline kind not built", fmt.Errorf("stage kind is %w yet: quantize", errkind.ErrNotBuilt), errkind.NotBuilt, exitFailure},
		{"pipeline verify stage", fmt.Errorf("stage c: %w: MTP head dropped", pipeline.ErrVerifyFailed), errkind.VerifyFailed, exitVerify},
		{"cli verify", verifyFailed(errors.New("MTP verification failed")), errkind.VerifyFailed, exitVerify},
		{"blob vanished", blobGone, errkind.VerifyFailed, exitVerify},
		{"retryable I/O", errkind.Mark(errkind.Retryable, errors.New("connection reset")), errkind.Retryable, exitFailure},
		{"cancelled context", fmt.Errorf("stage s: %w", context.Canceled), errkind.Interrupted, exitInterrupted},
		{"interrupted run", interrupted(cancelled, errors.New("write /x: file already closed")), errkind.Interrupted, exitInterrupted},
		{"interrupted bad input", interrupted(cancelled, must(safetensors.Open(junk))), errkind.Interrupted, exitInterrupted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.err == nil {
				t.Fatal("no error")
			}
			if k := errkind.Of(tt.err); k != tt.kind {
				t.Errorf("%v: kind %v, want %v", tt.err, k, tt.kind)
			}
			if c := exitCode(tt.err); c != tt.code {
				t.Errorf("%v: exit %d, want %d", tt.err, c, tt.code)
			}
		})
	}
	if exitCode(nil) != exitOK || exitCode(interrupted(cancelled, nil)) != exitOK {
		t.Error("no error must exit 0")
	}
	for k := errkind.Failure; k <= errkind.Interrupted; k++ {
		if _, ok := exitCodes[k]; !ok {
			t.Errorf("kind %v has no exit code", k)
		}
	}
}

// With --json a command that fails before its result prints the error as
// JSON on stdout (with the exit code), so a script reading stdout always
// gets JSON; one that printed its result keeps it alone; without --json
// stdout stays empty.
func TestJSONError(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	junk := filepath.Join(dir, "junk.gguf")
	if err := os.WriteFile(junk, []byte("not a gguf"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		code int
		json bool // stdout is the error object
	}{
		{"inspect, no such path", []string{"inspect", "--json", missing}, exitBadInput, true},
		{"flag after the path", []string{"inspect", missing, "--json"}, exitBadInput, true},
		{"--json=1", []string{"inspect", "--json=1", missing}, exitBadInput, true},
		{"--json=false", []string{"inspect", "--json=false", missing}, exitBadInput, false},
		{"store du, no store", []string{"store", "du", "--json", missing}, 0, true},
		{"without --json", []string{"inspect", missing}, exitBadInput, false},
		{"after --", []string{"inspect", "--", "--json"}, exitBadInput, false},
		{"verify printed its result", []string{"verify", "mtp", "--json", junk}, 0, false},
		{"unknown command", []string{"frob", "--json"}, exitBadInput, true},
		{"unknown subcommand", []string{"store", "frob", "--json"}, exitBadInput, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := execFerry(t, nil, c.args...)
			if r.code == exitOK {
				t.Fatalf("exit 0: %s", r.stdout)
			}
			if c.code != 0 && r.code != c.code {
				t.Errorf("exit %d, want %d: %s", r.code, c.code, r.stderr)
			}
			var e jsonError
			isErr := json.Unmarshal([]byte(r.stdout), &e) == nil && e.Error != ""
			if isErr != c.json {
				t.Fatalf("stdout %q: the error object %v, want %v", r.stdout, isErr, c.json)
			}
			if c.json && (e.ExitCode != r.code || !strings.Contains(r.stderr, e.Error)) {
				t.Errorf("error object %+v; exit %d, stderr %q", e, r.code, r.stderr)
			}
			var rep struct{ Results []any }
			switch {
			case c.name == "verify printed its result":
				if json.Unmarshal([]byte(r.stdout), &rep) != nil || len(rep.Results) != 1 {
					t.Errorf("stdout %q, want verify's report alone", r.stdout)
				}
			case !c.json && r.stdout != "":
				t.Errorf("stdout %q, want none", r.stdout)
			}
		})
	}
}

func TestUnknownCommand(t *testing.T) {
	app := newApp()
	// unknownCommand (and interspersed) step over the flags before a
	// command as booleans: a flag that takes a value there would make its
	// value look like a command.
	for _, f := range app.Flags {
		if _, ok := f.(*cli.BoolFlag); !ok {
			t.Errorf("global flag %v takes a value: unknownCommand would take it for a command", f.Names())
		}
	}
	for _, c := range app.Commands {
		if len(c.Subcommands) == 0 || c.Action != nil {
			continue
		}
		for _, f := range c.Flags {
			if _, ok := f.(*cli.BoolFlag); !ok {
				t.Errorf("flag %v of %s takes a value: unknownCommand would take it for a command", f.Names(), c.Name)
			}
		}
	}
	for _, c := range []struct {
		args []string
		want string // "": no error
	}{
		{[]string{"frob"}, `unknown command "frob"; see 'ferry --help'`},
		{[]string{"--verbose", "frob", "x"}, `unknown command "frob"; see 'ferry --help'`},
		{[]string{"store", "frob"}, `unknown command "frob"; see 'ferry store --help'`},
		{[]string{"pipeline", "--json", "rnu", "x.yaml"}, `unknown command "rnu"; see 'ferry pipeline --help'`},
		{[]string{"mlx", "requant"}, `unknown command "requant"; see 'ferry mlx --help'`},
		{[]string{}, ""},
		{[]string{"store"}, ""},
		{[]string{"store", "du", "frob"}, ""},      // du's argument
		{[]string{"store", "help"}, ""},            // cli's own help command
		{[]string{"help", "store", "du"}, ""},      // help for a command that is there
		{[]string{"store", "h", "du"}, ""},         // the same, shorter
		{[]string{"gguf", "frob"}, ""},             // gguf's action says what it needs
		{[]string{"verify", "a.gguf"}, ""},         // so does verify's
		{[]string{"inspect", "store", "frob"}, ""}, // inspect's arguments
		{[]string{"store", "du", "--", "frob"}, ""},
		// The command looked up is still named after -- and help.
		{[]string{"store", "--", "frob"}, `unknown command "frob"; see 'ferry store --help'`},
		{[]string{"store", "help", "frob"}, `unknown command "frob"; see 'ferry store --help'`},
		{[]string{"help", "frob"}, `unknown command "frob"; see 'ferry --help'`},
	} {
		err := unknownCommand(app, append([]string{"ferry"}, c.args...))
		got := ""
		if err != nil {
			got = err.Error()
			if code := exitCode(err); code != exitBadInput {
				t.Errorf("%q: exit %d, want %d", c.args, code, exitBadInput)
			}
		}
		if got != c.want {
			t.Errorf("%q: %q, want %q", c.args, got, c.want)
		}
	}
}

// `ferry pipeline run --events` that fails before the run starts still
// ends its stream: one line, the end event with the error stderr shows.
func TestEventsError(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	for _, c := range []struct {
		name   string
		args   []string
		events bool // stdout is one end event
	}{
		{"no such pipeline file", []string{"pipeline", "run", missing, "--events"}, true},
		{"--events with --json", []string{"pipeline", "run", missing, "--events", "--json"}, true},
		{"--events=true", []string{"pipeline", "run", "--events=true", missing}, true},
		{"--events=false", []string{"pipeline", "run", "--events=false", missing}, false},
		{"the last one counts, on", []string{"pipeline", "run", "--events=false", missing, "--events"}, true},
		{"the last one counts, off", []string{"pipeline", "run", "--events", missing, "--events=false"}, false},
		// Only pipeline run has events: elsewhere --json's error object.
		{"not pipeline run", []string{"store", "du", missing, "--json", "--events"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := execFerry(t, nil, c.args...)
			if r.code != exitBadInput {
				t.Errorf("exit %d, want %d: %s", r.code, exitBadInput, r.stderr)
			}
			if !c.events {
				var je jsonError
				isJSON := json.Unmarshal([]byte(r.stdout), &je) == nil && je.Error != ""
				if wantJSON := strings.Contains(strings.Join(c.args, " "), "--json"); r.stdout != "" && !(wantJSON && isJSON) {
					t.Errorf("stdout %q, want none (or --json's error object)", r.stdout)
				} else if wantJSON && !isJSON {
					t.Errorf("stdout %q, want --json's error object", r.stdout)
				}
				return
			}
			lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
			var e struct {
				Event, Error string
				Time         time.Time
			}
			if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &e) != nil {
				t.Fatalf("stdout %q, want one JSON line", r.stdout)
			}
			if e.Event != "end" || e.Error == "" || !strings.Contains(r.stderr, e.Error) || e.Time.IsZero() {
				t.Errorf("event %+v; stderr %q", e, r.stderr)
			}
		})
	}
}
