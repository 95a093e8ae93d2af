package pipeline_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/pipeline"
)

// importDurable is how far the import of one file has durably got: the end
// of the last finished unit in its resume journal, or the whole file once a
// record holds it.
func importDurable(t *testing.T, store string) int64 {
	t.Helper()
	s, err := manifest.Load(store)
	if err != nil {
		t.Fatalf("manifest after kill: %v", err)
	}
	for _, r := range s.Records() {
		for _, o := range r.Outputs {
			if o.Path == "big.bin" {
				return o.Size
			}
		}
	}
	var best int64
	// Every way of importing keeps an internal/journal journal per file:
	// its unit lines (the hash state of a file read in place or cloned, the
	// copied bytes and their hash) and commit line say what is durable.
	journals, _ := filepath.Glob(filepath.Join(store, "ingest", "*", "*", "journal"))
	for _, jp := range journals {
		b, _ := os.ReadFile(jp)
		for _, line := range strings.Split(string(b), "\n") {
			var l struct {
				Unit   string
				End    int64
				Commit string
				Size   int64
			}
			if json.Unmarshal([]byte(line), &l) != nil {
				break // torn last line
			}
			if l.Commit != "" {
				best = max(best, l.Size)
			} else if l.Unit != "" {
				best = max(best, l.End)
			}
		}
	}
	return best
}

// An import of a file far bigger than what one run can read in 300 ms,
// SIGKILLed every 300 ms and started again, finishes with the right digest:
// each run continues from the last unit the killed one made durable
// (progress never goes back), not from byte 0 — when the file is read in
// place (hash state saved per unit) and when it is copied
// (manifest.Journal). The file takes this machine 0.6 s to hash (as
// measured here, at least 256 MiB), so an import that starts over never
// finishes; the test fails if 25 kills in a row of runs that had the CPU
// time to finish a unit bring no progress, or after 200 kills of such runs
// (a run a loaded machine left too little CPU counts for neither), or
// after 10 minutes.
func TestKillResumeImport(t *testing.T) {
	if testing.Short() {
		t.Skip("imports a file of 0.6 s of hashing twice, killed every 300 ms; not in -short")
	}
	// sha256 on this machine at its best: the file takes twice the kill
	// period to hash, so a run that starts over can never finish, on any
	// machine; a loaded machine makes the resuming runs need more kills.
	buf := bytes.Repeat([]byte{0x5a}, 32<<20)
	var rate float64
	for range 3 {
		start := time.Now()
		sha256.Sum256(buf)
		rate = max(rate, float64(len(buf))/time.Since(start).Seconds())
	}
	size := min(max(int64(rate*0.6), 256<<20), 2<<30) &^ (16<<20 - 1)
	t.Logf("sha256 at %.0f MB/s: a %d MiB file", rate/1e6, size>>20)
	for _, tc := range []struct{ name, params string }{
		{"in place", ""},
		{"copy", ", copy: true"},
	} {
		t.Run(tc.name, func(t *testing.T) { killResumeImport(t, tc.params, size) })
	}
}

func killResumeImport(t *testing.T, params string, size int64) {
	bin := ferryBinary(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "model")
	write(t, filepath.Join(src, "config.json"), `{"architectures":["LlamaForCausalLM"]}`)
	// Sparse, with data scattered through it: nothing to write up front,
	// but every run must read and hash what it covers.
	big := filepath.Join(src, "big.bin")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	for off := int64(0); off < size; off += 7 << 20 {
		if _, err := f.WriteAt(bytes.Repeat([]byte{byte(off >> 20), 0x5a}, 2048), off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	want, _, err := manifest.HashFile(big)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "p.yaml")
	write(t, p, "name: imp\nstages:\n  - name: base\n    import: { path: model"+params+" }\n")
	store := filepath.Join(dir, ".ferry")

	const every, maxKills, maxStall = 300 * time.Millisecond, 200, 25
	// Enough CPU for a run to start and finish one 16 MiB unit.
	fair := 150 * time.Millisecond
	var cpus []time.Duration
	var durable int64
	kills, fairKills, stall := 0, 0, 0
	start := time.Now()
	for {
		cmd := exec.Command(bin, "pipeline", "run", "--json", p)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		var err error
		finished := false
		select {
		case err = <-exited:
			finished = true
		case <-time.After(every):
			cmd.Process.Signal(syscall.SIGKILL)
			<-exited
			kills++
		}
		if finished {
			if err != nil {
				t.Fatalf("run after %d kills: %v\n%s", kills, err, errb.String())
			}
			var rep pipeline.Report
			if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
				t.Fatal(err)
			}
			var got manifest.Digest
			for _, o := range rep.Stages[0].Outputs {
				if o.Path == "big.bin" {
					got = o.Digest
				}
			}
			if got != want {
				t.Fatalf("big.bin imported as %s, want %s", got, want)
			}
			break
		}
		d := importDurable(t, store)
		if d < durable {
			t.Fatalf("kill %d: durable progress went back from %d to %d bytes", kills, durable, d)
		}
		// A run the machine gave too little CPU to finish a unit (a loaded
		// machine) proves nothing either way.
		cpu := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		cpus = append(cpus, cpu)
		if cpu >= fair {
			fairKills++
		}
		if d > durable {
			stall = 0
		} else if cpu >= fair {
			stall++
		}
		durable = d
		if fairKills >= maxKills || stall >= maxStall || time.Since(start) > 10*time.Minute {
			t.Fatalf("import did not finish after %d kills every %v (%d with %v of CPU or more), the last %d of those with no progress (%d of %d bytes durable); CPU per run: %v",
				kills, every, fairKills, fair, stall, durable, size, cpus)
		}
	}
	t.Logf("finished after %d kills in %v; CPU per killed run: %v", kills, time.Since(start).Round(time.Millisecond), cpus)
	if kills < 2 {
		t.Errorf("only %d kills landed: the file is too small to test resume", kills)
	}
	if r := ferry(t, "store", "verify", p); r.code != 0 {
		t.Errorf("store verify: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
