package pipeline

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// Cause says in one word why a plan or a run runs a stage: the "cause"
// of --json output, for scripts; Reason says it for people.
type Cause string

// Causes of a stage running.
const (
	CauseNew     Cause = "new"     // never run in this pipeline (or its record is gone)
	CauseForced  Cause = "forced"  // --force or --from
	CauseParams  Cause = "params"  // its parameters changed (Reason names them)
	CauseInput   Cause = "input"   // an input stage's outputs changed
	CauseSource  Cause = "source"  // a file it reads outside the store changed (import)
	CauseOutput  Cause = "output"  // one of its outputs is missing or damaged
	CauseVersion Cause = "version" // ferry or the stage kind changed version
	CauseKind    Cause = "kind"    // the stage changed kind
	CauseRemote  Cause = "remote"  // --verify: the copies on remote hosts are checked again (transfer)
)

// paramDiff names the parameters that differ between two records' params
// (JSON objects): ": bits 4 -> 6, recipe (none) -> \"mixed_3_6\"". Values
// are shown as JSON, long ones cut.
func paramDiff(prev, cur json.RawMessage) string {
	var a, b map[string]json.RawMessage
	if json.Unmarshal(prev, &a) != nil || json.Unmarshal(cur, &b) != nil {
		return ""
	}
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	show := func(v json.RawMessage, ok bool) string {
		if !ok {
			return "(none)"
		}
		s := string(v)
		var x any
		if json.Unmarshal(v, &x) == nil {
			if c, err := json.Marshal(x); err == nil {
				s = string(c)
			}
		}
		if len(s) > 60 {
			s = s[:57] + "..."
		}
		return s
	}
	var diffs []string
	for k := range keys {
		va, oka := a[k]
		vb, okb := b[k]
		if oka && okb && jsonEqual(va, vb) {
			continue
		}
		diffs = append(diffs, fmt.Sprintf("%s %s -> %s", k, show(va, oka), show(vb, okb)))
	}
	if len(diffs) == 0 {
		return ""
	}
	sort.Strings(diffs)
	return ": " + strings.Join(diffs, ", ")
}
