package pipeline_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/s3test"
	"github.com/ferry-llm/ferry/manifest"
	. "github.com/ferry-llm/ferry/pipeline"
)

// An import from a bucket (a directory of objects, and one object): the
// objects' bytes land in the store as the stage's outputs with their
// sha256, the record names each object and its ETag and no local path, a
// second run skips both stages, and after one object is replaced only that
// stage runs again, keeping the other object's blob.
func TestImportS3(t *testing.T) {
	srv := s3test.Start(t, "models")
	srv.Env(t)
	put := func(key string, b []byte) {
		t.Helper()
		if _, err := srv.Client().PutObject(context.Background(), &s3api.PutObjectInput{Bucket: aws.String("models"), Key: aws.String(key), Body: bytes.NewReader(b)}); err != nil {
			t.Fatal(err)
		}
	}
	big := make([]byte, 17<<20+3) // two chunks, no sha256 in its metadata: hashed as it is read
	r := rand.New(rand.NewPCG(1, 2))
	for i := range big {
		big[i] = byte(r.Uint32())
	}
	put("base/config.json", []byte(`{"a":1}`))
	put("base/sub/w.bin", big)
	put("basement/other", []byte("not under base/"))
	dir := t.TempDir()
	spec := loadSpec(t, dir, `name: x
stages:
  - name: base
    import: { path: s3://models/base }
  - name: one
    import: { path: "s3://models/base/config.json" }
`)
	rep, err := Run(context.Background(), spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	sum := func(b []byte) digest.Digest { s := sha256.Sum256(b); return digest.New(s[:]) }
	want := []manifest.Output{{Path: "config.json", Digest: sum([]byte(`{"a":1}`)), Size: 7}, {Path: "sub/w.bin", Digest: sum(big), Size: int64(len(big))}}
	if got := rep.Stages[0].Outputs; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("base outputs %+v, want %+v", got, want)
	}
	if got := rep.Stages[1].Outputs; len(got) != 1 || got[0] != want[0] {
		t.Errorf("one outputs %+v, want %+v", got, want[:1])
	}
	if b, err := os.ReadFile(filepath.Join(rep.Stages[0].View, "sub", "w.bin")); err != nil || !bytes.Equal(b, big) {
		t.Errorf("the view's sub/w.bin: %v", err)
	}
	store, err := manifest.Load(filepath.Join(dir, ".ferry"))
	if err != nil {
		t.Fatal(err)
	}
	rec := store.Record(rep.Stages[0].Key)
	b, _ := json.Marshal(rec.Sources)
	if len(rec.Sources) != 2 || strings.Contains(string(b), dir) || !strings.Contains(string(b), `"s3://models/base/sub/w.bin#`) {
		t.Errorf("record sources: %s", b)
	}
	if rep, err = Run(context.Background(), spec, Options{}); err != nil || rep.Stages[0].Action != ActionSkip || rep.Stages[1].Action != ActionSkip {
		t.Fatalf("second run: %v, %+v", err, rep)
	}
	put("base/config.json", []byte(`{"a":2}`))
	// w.bin's bytes altered on the gateway's disk, its ETag (kept apart)
	// the same: fetched again, it would give another digest.
	head := func() string {
		h, err := srv.Client().HeadObject(context.Background(), &s3api.HeadObjectInput{Bucket: aws.String("models"), Key: aws.String("base/sub/w.bin")})
		if err != nil {
			t.Fatal(err)
		}
		return aws.ToString(h.ETag)
	}
	etag := head()
	f, err := os.OpenFile(srv.ObjectPath("models", "base/sub/w.bin"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{big[5] ^ 1}, 5)
	f.Close()
	if head() != etag {
		t.Fatal("the gateway changed the ETag of a file altered on its disk")
	}
	rep, err = Run(context.Background(), spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Stages[0].Action != ActionRun || !strings.Contains(rep.Stages[0].Reason, "config.json") {
		t.Errorf("after a change: %+v", rep.Stages[0])
	}
	if got := rep.Stages[0].Outputs; len(got) != 2 || got[0].Digest != sum([]byte(`{"a":2}`)) || got[1] != want[1] {
		t.Errorf("after a change: outputs %+v", got)
	}
	for _, bad := range []struct{ yaml, want string }{
		{`import: { path: "gs://bucket/m" }`, "gs://"},
		{`import: { path: "s3://models/base", follow_links: true }`, "follow_links"},
	} {
		_, err = Parse(filepath.Join(dir, "p.yaml"), dir, []byte("name: x\nstages:\n  - name: m\n    "+bad.yaml+"\n"))
		if err == nil || !strings.Contains(err.Error(), "p.yaml:4") || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v", bad.yaml, err)
		}
	}
	_, err = Parse(filepath.Join(dir, "p.yaml"), dir, []byte("name: x\nstages:\n  - name: m\n    import: { path: \"gs://bucket/m\" }\n"))
	if !errors.Is(err, errkind.ErrNotBuilt) {
		t.Errorf("gs://: %v (kind %v), want not built", err, errkind.Of(err))
	}
}

// An import from a bucket that does not exist fails with that said, and
// records nothing.
func TestImportS3NoBucket(t *testing.T) {
	srv := s3test.Start(t, "models")
	srv.Env(t)
	dir := t.TempDir()
	spec := loadSpec(t, dir, "name: x\nstages:\n  - name: base\n    import: { path: s3://nosuch/base }\n")
	_, err := Run(context.Background(), spec, Options{})
	if err == nil || errkind.Of(err) != errkind.BadInput || !strings.Contains(err.Error(), `bucket "nosuch" does not exist`) {
		t.Fatalf("want bad input naming the bucket, got %v (kind %v)", err, errkind.Of(err))
	}
}
