package merge

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestShardJournal covers the resume states of one shard file: a
// checkpoint continues the bytes and the digest; a kill between journaling
// the commit and the rename leaves the partial, which the next run renames
// (not removes as stale); a partial shorter than its checkpoint starts over.
func TestShardJournal(t *testing.T) {
	data := bytes.Repeat([]byte("shard bytes "), 50000)
	sum := sha256.Sum256(data)
	want := FileDigest{Name: "s.safetensors", Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
	for _, tc := range []struct {
		name string
		kill func(t *testing.T, dir string) // leaves the state a killed run leaves
		// wantResumeAt is where openShard continues (-1: the shard is finished)
		wantResumeAt int64
	}{
		{"checkpoint", func(t *testing.T, dir string) {
			o := openTestShard(t, dir)
			o.Write(data[:1000])
			o.checkpoint()
			o.Write(data[1000:2000]) // not durable: lost
			o.f.Close()
		}, 1000},
		{"sealed, not renamed", func(t *testing.T, dir string) {
			o := openTestShard(t, dir)
			o.Write(data)
			if _, err := o.seal(); err != nil {
				t.Fatal(err)
			}
		}, -1},
		{"partial shorter than its checkpoint", func(t *testing.T, dir string) {
			o := openTestShard(t, dir)
			o.Write(data[:1000])
			o.checkpoint()
			o.f.Close()
			os.Truncate(partialPath(dir, "s.safetensors"), 10)
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.kill(t, dir)
			j, err := openJournal(dir, "key")
			if err != nil {
				t.Fatal(err)
			}
			defer j.close()
			j.removeStale()
			if d, ok := j.finished(t.Context(), "s.safetensors"); ok != (tc.wantResumeAt < 0) || ok && d != want {
				t.Fatalf("finished: %v %+v", ok, d)
			}
			if tc.wantResumeAt < 0 {
				got, _ := os.ReadFile(filepath.Join(dir, "s.safetensors"))
				if !bytes.Equal(got, data) {
					t.Error("finished shard's bytes differ")
				}
				return
			}
			o, err := j.openShard("s.safetensors", time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if o.Written() != tc.wantResumeAt {
				t.Fatalf("resumed at %d, want %d", o.Written(), tc.wantResumeAt)
			}
			o.Write(data[o.Written():])
			d, err := o.commit()
			if err != nil || d != want {
				t.Fatalf("commit: %+v %v, want %+v", d, err, want)
			}
			got, _ := os.ReadFile(filepath.Join(dir, "s.safetensors"))
			if !bytes.Equal(got, data) {
				t.Error("resumed shard's bytes differ")
			}
		})
	}
}

func openTestShard(t *testing.T, dir string) *shardOut {
	t.Helper()
	j, err := openJournal(dir, "key")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(j.close)
	o, err := j.openShard("s.safetensors", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return o
}
