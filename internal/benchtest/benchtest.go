// Package benchtest is what ferry's model-sized benchmarks share: where
// their generated inputs live, how they are sized from the environment,
// and how the measured command runs in a process of its own, so that its
// wall time, CPU time and peak RSS are its alone.
//
// Inputs are written once per process into a temporary directory that
// Main removes; FERRY_BENCH_DIR names a directory that keeps them between
// runs instead. FERRY_BENCH_LAYERS and FERRY_BENCH_VOCAB size them where a
// benchmark says so.
package benchtest

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime/pprof"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/sysmem"
	"github.com/ferry-llm/ferry/internal/testmodel"
)

// DirEnv names a directory that keeps generated inputs between runs.
const DirEnv = "FERRY_BENCH_DIR"

var tmp struct {
	once sync.Once
	dir  string
	err  error
}

// Dir is the directory generated inputs go in: $FERRY_BENCH_DIR when set
// (made, with its parents, when it does not exist yet: benchmarks write
// files straight into it), else a temporary directory made once per
// process and removed by Main.
func Dir(tb testing.TB) string {
	tb.Helper()
	if dir := os.Getenv(DirEnv); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			tb.Fatalf("%s=%s: %v", DirEnv, dir, err)
		}
		return dir
	}
	tmp.once.Do(func() { tmp.dir, tmp.err = os.MkdirTemp("", "ferry-bench-") })
	if tmp.err != nil {
		tb.Fatal(tmp.err)
	}
	return tmp.dir
}

// Main is the TestMain of a package whose benchmarks use Dir: it runs the
// tests and benchmarks, then removes Dir's temporary directory.
func Main(m *testing.M) {
	code := m.Run()
	if tmp.dir != "" {
		os.RemoveAll(tmp.dir)
	}
	os.Exit(code)
}

// EnvInt is the positive integer in the environment variable key, def
// when it is unset.
func EnvInt(tb testing.TB, key string, def int) int {
	tb.Helper()
	s := os.Getenv(key)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		tb.Fatalf("%s=%q: want a positive integer", key, s)
	}
	return n
}

// Checkpoint is a generated checkpoint: its directory, the paths of its
// shard files in order, and the bytes of all its tensors.
type Checkpoint struct {
	Dir    string
	Shards []string
	Bytes  int64
}

// Checkpoint27B is a testmodel.Large27B(layers) checkpoint (Qwen3.5-27B
// widths, 2 GB BF16 shards) with a vocab-entry embedding and, with
// tokenizer, a tokenizer (WriteQwen35).
func Checkpoint27B(tb testing.TB, layers, vocab int, tokenizer bool) Checkpoint {
	return Checkpoint27BShards(tb, layers, vocab, tokenizer, 0)
}

// Checkpoint27BShards is Checkpoint27B with shards of at most shardBytes
// (0: Large27B's 2 GB): a slice cut into as many shards, for its size, as
// a full checkpoint (about eleven of 5 GB for 54 GB) is.
func Checkpoint27BShards(tb testing.TB, layers, vocab int, tokenizer bool, shardBytes int64) Checkpoint {
	tb.Helper()
	o := testmodel.Large27B(layers)
	o.VocabSize = vocab
	o.NoTokenizer = !tokenizer
	name := fmt.Sprintf("qwen35-27b-slice-%d-%d", layers, vocab)
	if tokenizer {
		name += "-tok"
	}
	if shardBytes > 0 && shardBytes != o.MaxShardSize {
		o.MaxShardSize = shardBytes
		name += fmt.Sprintf("-shard%dMB", shardBytes/1e6)
	}
	return WriteQwen35(tb, name, o)
}

// WriteQwen35 writes the checkpoint o describes into Dir/name on first
// use; a later call (or run, with FERRY_BENCH_DIR) finds it there.
func WriteQwen35(tb testing.TB, name string, o testmodel.Qwen35Options) Checkpoint {
	tb.Helper()
	dir := filepath.Join(Dir(tb), name)
	m, err := o.Layout()
	if err != nil {
		tb.Fatal(err)
	}
	if cfg, err := os.ReadFile(filepath.Join(dir, "config.json")); err == nil {
		var got, want any
		b, err := json.Marshal(m.Config)
		if err == nil {
			err = json.Unmarshal(b, &want)
		}
		if err == nil {
			err = json.Unmarshal(cfg, &got)
		}
		if err != nil || !reflect.DeepEqual(got, want) {
			tb.Fatalf("%s holds another checkpoint (its config.json is not this one's: %v): remove it", dir, err)
		}
	} else if m, err = o.Write(dir); err != nil {
		tb.Fatal(err)
	}
	ck := Checkpoint{Dir: dir, Bytes: m.TotalSize()}
	for _, s := range m.Shards {
		ck.Shards = append(ck.Shards, filepath.Join(dir, s))
	}
	return ck
}

// Measured is what Run measured of a finished child process.
type Measured struct {
	Wall, CPU time.Duration // CPU: user and system
	PeakRSS   int64         // bytes
}

// Run runs a command with env added to this process's environment, its
// stdout discarded, its stderr this process's, and fails tb unless it
// succeeds. (Nothing it prints is kept in this process: a child starts
// with its parent's peak RSS as its own on Linux, so a parent that grew
// would inflate every later child's figure.)
func Run(tb testing.TB, env []string, name string, args ...string) Measured {
	tb.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		tb.Fatalf("%s %v: %v", name, args, err)
	}
	wall := time.Since(start)
	ps := cmd.ProcessState
	return Measured{Wall: wall, CPU: ps.UserTime() + ps.SystemTime(), PeakRSS: sysmem.PeakRSS(ps)}
}

// ProcessCPU is the CPU time this process has used so far, user and
// system: around in-process work, what the work cost in CPU.
func ProcessCPU(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ProfileEnv names a file that a benchmark's measured child process
// writes its CPU profile to.
const ProfileEnv = "FERRY_BENCH_CPUPROFILE"

// StartProfile starts a CPU profile into $FERRY_BENCH_CPUPROFILE when it
// is set; stop ends it (call it before the process exits).
func StartProfile() (stop func(), err error) {
	prof := os.Getenv(ProfileEnv)
	if prof == "" {
		return func() {}, nil
	}
	f, err := os.Create(prof)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
