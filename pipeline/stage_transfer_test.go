package pipeline_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"github.com/ferry-llm/ferry/internal/s3test"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/sshdtest"
	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/pipeline/pipelinetest"

	. "github.com/ferry-llm/ferry/pipeline"
)

// A transfer stage sends its inputs' outputs to the host as the user's ssh
// reaches it (here a ~/.ssh/config naming the test sshd), records what was
// verified where, is skipped when run again (without connecting: the
// server is gone by then), and with --verify checks the remote copies
// again.
func TestTransferStage(t *testing.T) {
	s := sshdHome(t, "studio")

	dir := t.TempDir()
	src := filepath.Join(dir, "model")
	os.MkdirAll(filepath.Join(src, "sub"), 0o755)
	a := bytes.Repeat([]byte("weights "), 300000)
	writeFile(t, filepath.Join(src, "a.gguf"), string(a))
	writeFile(t, filepath.Join(src, "sub", "config.json"), `{"x": 1}`)
	dst := t.TempDir()
	spec := loadSpec(t, dir, `name: x
stages:
  - name: model
    import: { path: model }
  - name: shipped
    transfer: { from: [model], to: [studio:`+dst+`], streams: 2 }
`)
	run := func(verify bool) *Report {
		t.Helper()
		rep, err := Run(context.Background(), spec, Options{Verify: verify})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	rep := run(false)
	if got, err := os.ReadFile(filepath.Join(dst, "model", "a.gguf")); err != nil || !bytes.Equal(got, a) {
		t.Fatalf("remote a.gguf differs (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(dst, "model", "sub", "config.json")); err != nil {
		t.Fatal(err)
	}
	st := rep.Stages[1]
	if st.Action != ActionRun || len(st.Outputs) != 1 {
		t.Fatalf("stage report %+v", st)
	}
	store, err := manifest.Load(filepath.Join(dir, ".ferry"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(store.BlobPath(st.Outputs[0].Digest))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Destinations []struct {
			Destination string
			Netcheck    *struct {
				Iface    string
				Kind     string
				PathMTU  int `json:"path_mtu"`
				Findings []struct{ Level, Message string }
			}
			Files []struct {
				Path     string
				Digest   string
				Verified bool
			}
		}
	}
	if err := json.Unmarshal(b, &rec); err != nil || len(rec.Destinations) != 1 || len(rec.Destinations[0].Files) != 2 {
		t.Fatalf("record %s (%v)", b, err)
	}
	for _, f := range rec.Destinations[0].Files {
		if !f.Verified || f.Digest == "" {
			t.Errorf("record: %+v", f)
		}
	}
	// netcheck ran before the transfer, and what it found is recorded.
	if nc := rec.Destinations[0].Netcheck; nc == nil || nc.Iface != "lo" || nc.Kind != "loopback" || nc.PathMTU != 65535 || len(nc.Findings) != 0 {
		t.Errorf("record's netcheck = %+v, want lo, loopback, path MTU 65535, no findings", nc)
	}

	// --verify runs it again: the remote files are hashed, nothing sent,
	// the same record.
	if rep := run(true); rep.Stages[1].Action != ActionRun || rep.Stages[1].Outputs[0].Digest != st.Outputs[0].Digest || rep.Stages[1].Cause != CauseRemote {
		t.Errorf("--verify: %+v", rep.Stages[1])
	}
	// status says where each file is verified.
	status, err := Status(spec)
	if err != nil {
		t.Fatal(err)
	}
	if r := status.Stages[1].Remote; len(r) != 1 || r[0].Destination != "studio:"+dst || r[0].Verified != 2 || len(r[0].Files) != 2 ||
		r[0].Bytes != int64(len(a))+8 || r[0].Files[0].Digest == "" {
		t.Errorf("status remote: %+v", r)
	}
	// A requirement netcheck finds broken fails the stage before a byte
	// is sent (loopback's MTU is 65536), with the remedy; skip_netcheck
	// sends anyway; a via interface this machine lacks is refused.
	reqSpec := func(sub, extra string) *Spec {
		return loadSpec(t, dir, `name: x
stages:
  - name: model
    import: { path: model }
  - name: shipped
    transfer: { from: [model], to: [studio:`+dst+`/`+sub+`], `+extra+` }
`)
	}
	_, err = Run(context.Background(), reqSpec("mtu", "expect_mtu: 9000"), Options{})
	if errkind.Of(err) != errkind.VerifyFailed || err == nil || !strings.Contains(err.Error(), "lo MTU is 65536, --expect-mtu 9000") {
		t.Errorf("expect_mtu 9000: %v (kind %v), want a failed check naming lo's MTU", err, errkind.Of(err))
	}
	if _, err := os.Stat(filepath.Join(dst, "mtu")); err == nil {
		t.Error("a failed netcheck sent something")
	}
	if _, err := Run(context.Background(), reqSpec("skip", "expect_mtu: 9000, skip_netcheck: true"), Options{}); err != nil {
		t.Errorf("skip_netcheck: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dst, "skip", "model", "a.gguf")); err != nil {
		t.Errorf("skip_netcheck: %v", err)
	}
	// Out-of-range tuning is refused when the file is loaded, naming the key.
	for _, extra := range []string{"streams: 0", "streams: 65", "sessions: 0", "sessions: 17"} {
		p := filepath.Join(dir, "tuning.yaml")
		writeFile(t, p, `name: x
stages:
  - name: model
    import: { path: model }
  - name: shipped
    transfer: { from: [model], to: [studio:`+dst+`/tuning], `+extra+` }
`)
		key, _, _ := strings.Cut(extra, ":")
		if _, err := Load(p, WithKinds(pipelinetest.Kinds())); errkind.Of(err) != errkind.BadInput || err == nil || !strings.Contains(err.Error(), "transfer."+key+": must be between") {
			t.Errorf("%s: %v (kind %v), want bad input naming transfer.%s", extra, err, errkind.Of(err), key)
		}
	}
	if _, err := Run(context.Background(), reqSpec("via", "via: nosuch0"), Options{}); errkind.Of(err) != errkind.Usage {
		t.Errorf("via nosuch0: %v (kind %v), want a usage error", err, errkind.Of(err))
	}
	if _, err := os.Stat(filepath.Join(dst, "via")); err == nil {
		t.Error("via nosuch0 sent something")
	}
	// Without --verify a finished transfer is skipped: no connection.
	s.Stop()
	if rep := run(false); rep.Stages[1].Action != ActionSkip {
		t.Errorf("rerun: %+v", rep.Stages[1])
	}
}

// A pipeline file may say how its hosts are reached (ssh_config,
// known_hosts, identity), as ferry transfer's flags do; ferry pipeline
// run's flags (Options.SSH) take precedence. Here the user's own
// ~/.ssh has nothing: only what the file or the options name reaches the
// server.
func TestTransferStageSSHSettings(t *testing.T) {
	s := sshdtest.Start(t, sshdtest.SSHDConfig("SetEnv HOME="+t.TempDir()))
	t.Setenv("HOME", t.TempDir())
	t.Setenv("SSH_AUTH_SOCK", "")
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "model", "a.bin"), "weights")
	dst := t.TempDir()
	spec := func(sub, extra string) *Spec {
		return loadSpec(t, dir, `name: x
stages:
  - name: model
    import: { path: model }
  - name: shipped
    transfer: { from: [model], to: [`+s.Alias+`:`+dst+`/`+sub+`], skip_netcheck: true`+extra+` }
`)
	}
	// Nothing says where the host is: refused.
	if _, err := Run(context.Background(), spec("none", ""), Options{}); err == nil {
		t.Fatal("a host no config names was reached")
	}
	// The file names them (relative to the file, as every path in it).
	cfg := filepath.Join(dir, "ssh", "config")
	writeFile(t, cfg, strings.ReplaceAll(s.HostBlock(s.Alias), "UserKnownHostsFile", "# UserKnownHostsFile"))
	kh := filepath.Join(dir, "ssh", "known_hosts")
	writeFile(t, kh, s.KnownHostsLine()+"\n")
	if _, err := Run(context.Background(), spec("file", `, ssh_config: ssh/config, known_hosts: ssh/known_hosts, identity: [`+s.ClientKeyPath+`]`), Options{}); err != nil {
		t.Fatalf("settings from the file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dst, "file", "model", "a.bin")); err != nil {
		t.Error(err)
	}
	// The run's options win over the file's.
	bad := filepath.Join(dir, "ssh", "wrong_known_hosts")
	writeFile(t, bad, "")
	_, err := Run(context.Background(), spec("over", `, ssh_config: ssh/config, known_hosts: ssh/wrong_known_hosts`), Options{SSH: SSHSettings{KnownHosts: kh}})
	if err != nil {
		t.Fatalf("options over the file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dst, "over", "model", "a.bin")); err != nil {
		t.Error(err)
	}
}

// Files at a destination that the stage did not put there (a quant
// dropped from the list) are in the record; delete_extra removes them.
func TestTransferStageExtra(t *testing.T) {
	sshdHome(t, "studio")
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "model", "a.bin"), "weights")
	dst := t.TempDir()
	writeFile(t, filepath.Join(dst, "model", "old-Q6_K.gguf"), "an older quant")
	spec := func(extra string) *Spec {
		return loadSpec(t, dir, `name: x
stages:
  - name: model
    import: { path: model }
  - name: shipped
    transfer: { from: [model], to: [studio:`+dst+`], skip_netcheck: true`+extra+` }
`)
	}
	record := func(extra string) (extraFiles, deleted []string) {
		t.Helper()
		rep, err := Run(context.Background(), spec(extra), Options{})
		if err != nil {
			t.Fatal(err)
		}
		store, err := manifest.Load(filepath.Join(dir, ".ferry"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(store.BlobPath(rep.Stages[1].Outputs[0].Digest))
		if err != nil {
			t.Fatal(err)
		}
		var rec struct {
			Destinations []struct{ Extra, Deleted []string }
		}
		if err := json.Unmarshal(b, &rec); err != nil {
			t.Fatal(err)
		}
		return rec.Destinations[0].Extra, rec.Destinations[0].Deleted
	}
	if x, d := record(""); len(x) != 1 || x[0] != "model/old-Q6_K.gguf" || len(d) != 0 {
		t.Errorf("extra %v, deleted %v", x, d)
	}
	if _, err := os.Stat(filepath.Join(dst, "model", "old-Q6_K.gguf")); err != nil {
		t.Error("removed without delete_extra")
	}
	if x, d := record(", delete_extra: true"); len(d) != 1 || d[0] != "model/old-Q6_K.gguf" || len(x) != 1 {
		t.Errorf("extra %v, deleted %v", x, d)
	}
	if _, err := os.Stat(filepath.Join(dst, "model", "old-Q6_K.gguf")); err == nil {
		t.Error("delete_extra left the extra file")
	}
}

// A transfer stage's destinations may mix SSH hosts and local directories
// (relative to the pipeline file); the record says what each verified,
// and a second run skips the stage.
func TestTransferStageLocal(t *testing.T) {
	sshdHome(t, "studio")
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "model", "a.bin"), "weights")
	remote := t.TempDir()
	spec := loadSpec(t, dir, `name: x
stages:
  - name: model
    import: { path: model }
  - name: shipped
    transfer: { from: [model], to: [studio:`+remote+`, backup/models, "file://`+filepath.Join(dir, "disk")+`"], skip_netcheck: true }
`)
	rep, err := Run(context.Background(), spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{remote, filepath.Join(dir, "backup", "models"), filepath.Join(dir, "disk")} {
		if b, err := os.ReadFile(filepath.Join(d, "model", "a.bin")); err != nil || string(b) != "weights" {
			t.Errorf("%s: %q, %v", d, b, err)
		}
	}
	b := stageRecord(t, dir, rep, 1)
	var rec struct {
		Destinations []struct {
			Destination string
			HashCommand string `json:"hash_command"`
		}
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	if len(rec.Destinations) != 3 || rec.Destinations[1].Destination != filepath.Join(dir, "backup", "models") || rec.Destinations[1].HashCommand != "re-read" {
		t.Errorf("record: %s", b)
	}
	rep, err = Run(context.Background(), spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if a := rep.Stages[1].Action; a != "skip" {
		t.Errorf("second run: %s, want skip", a)
	}
}

// A transfer stage to an S3 prefix (a real versitygw on 127.0.0.1, settings
// from the environment as every S3 tool reads them) beside a local
// directory: the objects hold the stage's bytes, the record says each was
// verified, a second run skips the stage; a scheme ferry does not write to
// is refused as not built, with its line.
func TestTransferStageS3(t *testing.T) {
	srv := s3test.Start(t, "models")
	srv.Env(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "model", "a.bin"), "weights")
	spec := loadSpec(t, dir, `name: x
stages:
  - name: model
    import: { path: model }
  - name: shipped
    transfer: { from: [model], to: ["s3://models/jarvis", backup] }
`)
	rep, err := Run(context.Background(), spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{srv.ObjectPath("models", "jarvis/model/a.bin"), filepath.Join(dir, "backup", "model", "a.bin")} {
		if b, err := os.ReadFile(p); err != nil || string(b) != "weights" {
			t.Errorf("%s: %q, %v", p, b, err)
		}
	}
	b := stageRecord(t, dir, rep, 1)
	var rec struct {
		Destinations []struct {
			Destination string
			Files       []struct{ Verified bool }
		}
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	if len(rec.Destinations) != 2 || rec.Destinations[0].Destination != "s3://models/jarvis" || len(rec.Destinations[0].Files) != 1 || !rec.Destinations[0].Files[0].Verified {
		t.Errorf("record: %s", b)
	}
	if rep, err = Run(context.Background(), spec, Options{}); err != nil || rep.Stages[1].Action != "skip" {
		t.Errorf("second run: %v, %+v", err, rep)
	}
	_, err = Parse(filepath.Join(dir, "p.yaml"), dir, []byte(`name: x
stages:
  - name: model
    import: { path: model }
  - name: shipped
    transfer: { from: [model], to: ["gs://bucket/models"] }
`))
	if !errors.Is(err, errkind.ErrNotBuilt) || errkind.Of(err) != errkind.NotBuilt || !strings.Contains(err.Error(), "p.yaml:6") {
		t.Errorf("gs://: %v (kind %v)", err, errkind.Of(err))
	}
}

// stageRecord is the bytes of stage i's first output in the store of the
// pipeline in dir (a transfer stage's transfer-record.json).
func stageRecord(t *testing.T, dir string, rep *Report, i int) []byte {
	t.Helper()
	store, err := manifest.Load(filepath.Join(dir, ".ferry"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(store.BlobPath(rep.Stages[i].Outputs[0].Digest))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
