package manifest

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// Two stages of one run may adopt files with the same new content at the
// same moment (a config both write unchanged): both must succeed.
func TestAdoptSameContentConcurrently(t *testing.T) {
	s := openTemp(t)
	dir := t.TempDir()
	for i := 0; i < 40; i++ {
		content := []byte(fmt.Sprintf("content %d", i))
		d := DigestOf(content)
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for w := range errs {
			p := filepath.Join(dir, fmt.Sprintf("f%d-%d", i, w))
			if err := os.WriteFile(p, content, 0o644); err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _, errs[w] = s.AdoptKnown(p, d, int64(len(content)))
			}()
		}
		wg.Wait()
		for w, err := range errs {
			if err != nil {
				t.Fatalf("round %d, adopter %d: %v", i, w, err)
			}
		}
		if b, err := os.ReadFile(s.BlobPath(d)); err != nil || string(b) != string(content) {
			t.Fatalf("round %d: blob %q %v", i, b, err)
		}
	}
}
