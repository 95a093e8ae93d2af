package s3_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/s3test"
	"github.com/ferry-llm/ferry/store"
	"github.com/ferry-llm/ferry/store/local"
	s3store "github.com/ferry-llm/ferry/store/s3"
)

// A local store copied to S3 and back holds the same records, refs and
// blob bytes; a copy killed midway continues where it stopped, and a
// second copy moves nothing.
func TestCopyLocalS3(t *testing.T) {
	srv := s3test.Start(t, "ferry-copy")
	srv.Env(t)
	ctx := context.Background()
	openStore := func(b store.Backend) *store.Store {
		s, err := store.Open(ctx, b, store.Options{CacheDir: t.TempDir(), PartSize: store.MinPartSize, Parallel: 2, Host: "gpu-box"})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	lb, err := local.New(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	src := openStore(lb)
	blobs := [][]byte{bytes.Repeat([]byte("merged shard "), 1e6), []byte(`{"config":1}`), bytes.Repeat([]byte("q4 "), 3e6)}
	var outs []store.Output
	for i, data := range blobs {
		d := digest.Of(data)
		if err := src.PutBlob(ctx, d, bytes.NewReader(data), int64(len(data)), nil); err != nil {
			t.Fatal(err)
		}
		outs = append(outs, store.Output{Path: []string{"model.safetensors", "config.json", "model-Q4_K_M.gguf"}[i], Digest: d, Size: int64(len(data))})
	}
	for _, r := range []*store.Record{{Key: "merge", Outputs: outs[:2]}, {Key: "quant", Outputs: outs[2:]}} {
		if _, err := src.CommitRecord(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := src.SetRef(ctx, "jarvis2/merged", "merge", nil); err != nil {
		t.Fatal(err)
	}
	sb, err := s3store.Open(ctx, "s3://ferry-copy/team")
	if err != nil {
		t.Fatal(err)
	}
	dst := openStore(sb)

	// Killed once the first record's two blobs are there, before its
	// record is.
	kctx, cancel := context.WithCancel(ctx)
	var moved int64
	_, err = store.Copy(kctx, src, dst, store.CopyOptions{Progress: func(n int64) {
		if moved += n; moved >= int64(len(blobs[0])+len(blobs[1])) {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("killed copy: %v", err)
	}
	rep, err := store.Copy(ctx, src, dst, store.CopyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Records != 2 || rep.Blobs != 1 || rep.BlobsThere != 2 || rep.Refs != 1 {
		t.Errorf("resumed copy: %+v", rep)
	}
	if v, err := dst.Verify(ctx, nil); err != nil || !v.OK() || v.Blobs != 3 || v.Records != 2 || v.Unreferenced != 0 {
		t.Fatalf("verify after copy: %+v, %v", v, err)
	}
	if rep, err := store.Copy(ctx, src, dst, store.CopyOptions{}); err != nil || rep.Blobs != 0 || rep.Records != 0 || rep.RecordsThere != 2 || rep.RefsThere != 1 {
		t.Errorf("second copy: %+v, %v", rep, err)
	}
	r, err := dst.Record(ctx, "merge")
	if err != nil || r.Host != "gpu-box" {
		t.Fatalf("record in S3: %+v, %v", r, err)
	}

	// And back, onto another machine's local store.
	lb2, _ := local.New(filepath.Join(t.TempDir(), "mac"))
	back := openStore(lb2)
	if _, err := store.Copy(ctx, dst, back, store.CopyOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, o := range outs {
		got, err := back.ReadBlob(ctx, o.Digest, o.Size)
		if err != nil || !bytes.Equal(got, blobs[indexOf(outs, o)]) {
			t.Errorf("%s after the round trip: %v", o.Path, err)
		}
	}
	if ref, err := back.GetRef(ctx, "jarvis2/merged"); err != nil || ref.Value != "merge" {
		t.Errorf("ref after the round trip: %+v, %v", ref, err)
	}
}

func indexOf(outs []store.Output, o store.Output) int {
	for i := range outs {
		if outs[i] == o {
			return i
		}
	}
	return -1
}
