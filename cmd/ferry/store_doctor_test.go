package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/s3test"
	"github.com/ferry-llm/ferry/store"
)

// store doctor probes a real S3 server and a directory, prints each check,
// and exits 2 with a clear error when the store cannot be reached.
func TestStoreDoctor(t *testing.T) {
	srv := s3test.Start(t, "ferry-doctor")
	srv.Env(t)
	out, code, err := runFerry(t, "store", "doctor", "s3://ferry-doctor/team")
	if code != exitOK {
		t.Fatalf("exit %d: %v\n%s", code, err, out)
	}
	for _, want := range []string{
		"store s3://ferry-doctor/team (endpoint " + srv.Endpoint + ")",
		"  ok    create-only write of an existing key is refused (412)",
		"  ok    a body that does not match its SHA-256 is refused and not stored",
		"conditional writes are honoured: machines can share this store",
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	out, code, _ = runFerry(t, "store", "doctor", "--json", "s3://ferry-doctor/team")
	var rep store.ProbeReport
	if code != exitOK || json.Unmarshal([]byte(out), &rep) != nil || !rep.OK || !rep.ConditionalDelete || len(rep.Checks) < 10 {
		t.Fatalf("--json: exit %d\n%s", code, out)
	}
	out, code, _ = runFerry(t, "store", "doctor", t.TempDir())
	if code != exitOK || !strings.Contains(out, "machines can share this store") {
		t.Errorf("directory: exit %d\n%s", code, out)
	}

	t.Setenv("AWS_SECRET_ACCESS_KEY", "wrong")
	out, code, err = runFerry(t, "store", "doctor", "s3://ferry-doctor/team")
	if code != exitBadInput || !strings.Contains(err.Error(), "refused the credentials") {
		t.Errorf("wrong secret: exit %d, %v\n%s", code, err, out)
	}
	if _, code, _ = runFerry(t, "store", "doctor"); code != exitBadInput {
		t.Errorf("no argument: exit %d", code)
	}
}
