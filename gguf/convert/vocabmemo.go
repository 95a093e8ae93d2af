package convert

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/internal/fsutil"
)

// vocabMemo remembers what gpt2Vocab wrote for the last tokenizers this
// process read. A pipeline plans its f16 and quants stages and then runs
// them: four plans of one merged checkpoint, each of which parsed its
// 248k-token tokenizer.json again (about a second of one core each, on
// the way to the stages' start and inside their runs).
//
// An entry is keyed by what gpt2Vocab reads (vocabKey). Plans asking for
// one key at once wait for a single parse; two entries are kept (tens of
// MB each at that vocabulary).
var vocabMemo = &memo{max: 2}

type memo struct {
	mu      sync.Mutex
	max     int
	entries []*memoEntry // least recently used first
	parses  int          // for tests: how many times the work ran
}

type memoEntry struct {
	key      string
	done     chan struct{}
	ok       bool // the work succeeded (a failure is not kept)
	kvs      []gguf.KV
	warnings []string
}

// do returns what work wrote for key, running it once per key while the
// entry is kept. A failed run is not remembered: the next caller runs it
// again (and sees its error).
func (c *memo) do(key string, work func() ([]gguf.KV, []string, error)) ([]gguf.KV, []string, error) {
	for {
		c.mu.Lock()
		var e *memoEntry
		for i, x := range c.entries {
			if x.key == key {
				e = x
				c.entries = append(append(c.entries[:i:i], c.entries[i+1:]...), x)
				break
			}
		}
		if e != nil {
			c.mu.Unlock()
			<-e.done
			if e.ok {
				return e.kvs, e.warnings, nil
			}
			continue // the run it waited for failed: run it here
		}
		e = &memoEntry{key: key, done: make(chan struct{})}
		c.entries = append(c.entries, e)
		if len(c.entries) > c.max {
			c.entries = append([]*memoEntry(nil), c.entries[len(c.entries)-c.max:]...)
		}
		c.parses++
		c.mu.Unlock()
		kvs, warnings, err := work()
		c.mu.Lock()
		if err == nil {
			e.ok, e.kvs, e.warnings = true, kvs, warnings
		} else {
			for i, x := range c.entries {
				if x == e {
					c.entries = append(c.entries[:i:i], c.entries[i+1:]...)
					break
				}
			}
		}
		close(e.done)
		c.mu.Unlock()
		return kvs, warnings, err
	}
}

// vocabKey is the memo key of gpt2Vocab over dir: the family's default
// pre-tokenizer, Options.Pre, and the name and SHA-256 of every file of
// the directory but the weights (a file larger than a tokenizer may be is
// named by its stamp: size, modification time, inode; a directory by the
// names in it). Two views of one
// checkpoint (a plan's and a run's) share a key; a file changed on disk
// makes another. "" when the directory cannot be read: nothing is kept.
func vocabKey(dir, defaultPre, pre string) string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return ""
	}
	h := sha256.New()
	fmt.Fprintf(h, "pre %q %q\n", defaultPre, pre)
	for _, e := range ents { // sorted by name
		n := e.Name()
		if strings.HasSuffix(n, ".safetensors") {
			continue
		}
		p := filepath.Join(dir, n)
		fi, err := os.Stat(p)
		if err != nil {
			return ""
		}
		switch {
		case fi.IsDir():
			// Its entries' names (the parse refuses a directory of
			// additional chat templates by what it holds).
			sub, err := os.ReadDir(p)
			if err != nil {
				return ""
			}
			fmt.Fprintf(h, "dir %q %d\n", n, len(sub))
			for _, e := range sub {
				fmt.Fprintf(h, "  %q\n", e.Name())
			}
		case fi.Size() > maxTokenizerFile:
			st := fsutil.StampOf(fi)
			fmt.Fprintf(h, "big %q %d %d %d\n", n, st.Size, st.MtimeNs, st.Inode)
		default:
			f, err := os.Open(p)
			if err != nil {
				return ""
			}
			fmt.Fprintf(h, "file %q\n", n)
			k, err := io.Copy(h, io.LimitReader(f, maxTokenizerFile+1))
			f.Close()
			if err != nil {
				return ""
			}
			fmt.Fprintf(h, "\n%d\n", k)
		}
	}
	return string(h.Sum(nil))
}
