package benchtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/testmodel"
)

// TestEnvInt: unset is the default, a positive integer is itself.
func TestEnvInt(t *testing.T) {
	for _, tc := range []struct {
		val  string
		want int
	}{{"", 4}, {"1", 1}, {"12", 12}} {
		t.Setenv("FERRY_BENCHTEST_N", tc.val)
		if got := EnvInt(t, "FERRY_BENCHTEST_N", 4); got != tc.want {
			t.Errorf("FERRY_BENCHTEST_N=%q: %d, want %d", tc.val, got, tc.want)
		}
	}
}

// TestDir: FERRY_BENCH_DIR is the directory when set, made (with its
// parents) when it does not exist yet; otherwise one temporary directory
// serves the whole process.
func TestDir(t *testing.T) {
	root := t.TempDir()
	for _, keep := range []string{
		root,                               // there already
		filepath.Join(root, "bench"),       // not yet
		filepath.Join(root, "a", "b", "c"), // nor its parents
	} {
		t.Setenv(DirEnv, keep)
		if got := Dir(t); got != keep {
			t.Errorf("with %s=%s: Dir %s", DirEnv, keep, got)
		}
		if st, err := os.Stat(keep); err != nil || !st.IsDir() {
			t.Errorf("with %s=%s: not a directory after Dir: %v", DirEnv, keep, err)
		}
	}
	t.Setenv(DirEnv, "")
	a, b := Dir(t), Dir(t)
	if a != b || strings.HasPrefix(a, root) {
		t.Errorf("without %s: Dir %s then %s", DirEnv, a, b)
	}
	if st, err := os.Stat(a); err != nil || !st.IsDir() {
		t.Errorf("Dir %s: %v", a, err)
	}
}

// TestRun: the child gets the added environment, and its wall time and
// peak RSS are measured.
func TestRun(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh on this machine")
	}
	out := filepath.Join(t.TempDir(), "out")
	m := Run(t, []string{"BENCHTEST_VALUE=ok"}, sh, "-c", `printf %s "$BENCHTEST_VALUE" > "$1"`, "sh", out)
	if b, err := os.ReadFile(out); err != nil || string(b) != "ok" {
		t.Errorf("child wrote %q (%v), want ok", b, err)
	}
	if m.Wall <= 0 || m.PeakRSS <= 0 || m.CPU < 0 {
		t.Errorf("measured %+v, want a wall time and a peak RSS", m)
	}
}

// TestWriteQwen35: the first call writes the checkpoint, a later one finds
// it and describes it alike (from the layout, writing nothing): the same
// shard files, each there, holding the tensor bytes.
func TestWriteQwen35(t *testing.T) {
	t.Setenv(DirEnv, t.TempDir())
	o := testmodel.Qwen35Options{}
	first := WriteQwen35(t, "tiny", o)
	again := WriteQwen35(t, "tiny", o)
	if !reflect.DeepEqual(first, again) {
		t.Fatalf("first call %+v, then %+v", first, again)
	}
	if len(first.Shards) < 2 || first.Bytes <= 0 {
		t.Fatalf("%+v: want several shards and their tensor bytes", first)
	}
	var files int64
	for _, s := range first.Shards {
		st, err := os.Stat(s)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Dir(s) != first.Dir {
			t.Errorf("shard %s is not in %s", s, first.Dir)
		}
		files += st.Size()
	}
	if first.Bytes >= files {
		t.Errorf("%d tensor bytes in %d bytes of shards (headers included)", first.Bytes, files)
	}
}

func TestMain(m *testing.M) { Main(m) }
