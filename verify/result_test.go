package verify

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/jsonout"
	"github.com/ferry-llm/ferry/internal/testmodel"
)

// Check names the result as the caller asks (the Report too), passes what
// Report.Pass passes, and says why a result fails: the verdict and its
// message, that an absent head was required, or why the artifact could not
// be checked. Summarize passes only when every result does.
func TestCheck(t *testing.T) {
	ok := gen(t, testmodel.Qwen35Options{})
	dropped := gen(t, testmodel.Qwen35Options{Hybrid: testmodel.Hybrid{OmitMTPTensors: true}})
	absent := gen(t, testmodel.Qwen35Options{Hybrid: testmodel.Hybrid{NoMTP: true}})
	notModel := filepath.Join(t.TempDir(), "notes.txt")
	os.WriteFile(notModel, []byte("hello"), 0o644)
	for _, tc := range []struct {
		name    string
		path    string
		require bool
		pass    bool
		reason  string // prefix; "" for none
		err     error
	}{
		{"ok", ok, true, true, "", nil},
		{"dropped", dropped, false, false, "dropped: config.json promises", nil},
		{"absent", absent, false, true, "", nil},
		{"absent but required", absent, true, false, "absent (an MTP head is required): no MTP head", nil},
		{"not a model", notModel, false, false, notModel + ": ", ErrNotModel},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := Options{Require: tc.require}
			r, err := Check("stage/x", tc.path, opts)
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if r.Path != "stage/x" || r.Pass != tc.pass {
				t.Errorf("path %q pass %v, want %q %v", r.Path, r.Pass, "stage/x", tc.pass)
			}
			if (tc.reason == "") != (r.Reason == "") || !strings.HasPrefix(r.Reason, tc.reason) {
				t.Errorf("reason %q, want prefix %q", r.Reason, tc.reason)
			}
			if tc.err != nil {
				if r.Report != nil || r.Error != err.Error() {
					t.Errorf("error result: %+v", r)
				}
			} else if r.Report == nil || r.Report.Path != "stage/x" {
				t.Errorf("report %+v, want one named stage/x", r.Report)
			}
			sum := Summarize(opts, []Result{r})
			if sum.Pass != tc.pass || sum.Require != tc.require || len(sum.Failed()) != map[bool]int{true: 0, false: 1}[tc.pass] {
				t.Errorf("summary %+v", sum)
			}
			// One "path" key, whatever the Report holds.
			var b bytes.Buffer
			if err := jsonout.Write(&b, r); err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(b.String(), `"path"`); n != 1 {
				t.Errorf("%d path keys:\n%s", n, b.String())
			}
			var back Result
			if err := json.Unmarshal(b.Bytes(), &back); err != nil || back.Path != "stage/x" || back.Pass != tc.pass || back.Reason != r.Reason {
				t.Errorf("round trip: %+v %v", back, err)
			}
		})
	}
	if s := Summarize(Options{}, nil); !s.Pass || s.Results == nil {
		t.Errorf("empty summary %+v: want a pass and results []", s)
	}
}
