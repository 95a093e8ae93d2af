package verify

import "fmt"

// Result is the outcome of the MTP check of one artifact, as every caller
// reports it: `ferry verify mtp --json` prints one per PATH, and the
// pipeline's verify_mtp stage stores one per artifact in mtp-report.json,
// both inside a Summary. A script reads the same keys from either:
//
//	{
//	  "path": "f16/model.gguf",  // the artifact, as the caller names it
//	  "pass": false,
//	  "reason": "dropped: config.json promises 1 MTP layer(s) …",
//	  "format": "gguf", "verdict": "dropped", "message": "…", …
//	}
//
// The Report's fields sit at the top level beside path, pass and reason, so
// `.results[] | select(.pass|not) | .path + ": " + .reason` lists every
// failure whatever its cause. path is the artifact as the caller names it: the
// CLI's PATH argument; for a pipeline stage "<stage>" (a safetensors or MLX
// directory) or "<stage>/<file>.gguf", never a location in the store, so the
// stored report depends on the content alone. (The Report's own path is the
// same and is not written twice.)
//
// An artifact that could not be checked at all (not a model, a truncated
// header) has no Report: pass is false and error and reason say why. Only
// the CLI reports such a result; a pipeline stage fails instead.
type Result struct {
	Path string `json:"path"`
	Pass bool   `json:"pass"`
	// Reason says why the artifact fails ("" when it passes): the verdict
	// and its message (an absent head that is required says so), or Error.
	Reason string `json:"reason,omitempty"`
	// Error is why the artifact could not be checked; Report is nil then.
	Error string `json:"error,omitempty"`
	*Report
}

// Summary is the outcome of one MTP run over several artifacts: what
// `ferry verify mtp --json` prints and what a verify_mtp stage stores as
// mtp-report.json. Pass is true when every result passes; Require and Deep
// are the options the run used.
type Summary struct {
	Pass    bool     `json:"pass"`
	Require bool     `json:"require"`
	Deep    bool     `json:"deep"`
	Results []Result `json:"results"`
}

// Check runs MTP on the artifact at path and returns its Result under name
// (the artifact as the caller reports it; see Result). err is MTP's error
// when path cannot be checked at all; the Result then carries its text.
func Check(name, path string, opts Options) (Result, error) {
	rep, err := MTP(path, opts)
	if err != nil {
		return Result{Path: name, Reason: err.Error(), Error: err.Error()}, err
	}
	rep.Path = name
	r := Result{Path: name, Pass: rep.Pass(opts.Require), Report: rep}
	if !r.Pass {
		verdict := string(rep.Verdict)
		if rep.Verdict == Absent && opts.Require {
			verdict += " (an MTP head is required)"
		}
		r.Reason = fmt.Sprintf("%s: %s", verdict, rep.Message)
	}
	return r, nil
}

// Summarize gathers the results of a run made with opts.
func Summarize(opts Options, results []Result) Summary {
	s := Summary{Pass: true, Require: opts.Require, Deep: opts.Deep, Results: results}
	if s.Results == nil {
		s.Results = []Result{}
	}
	for _, r := range results {
		s.Pass = s.Pass && r.Pass
	}
	return s
}

// Failed is the results that do not pass.
func (s Summary) Failed() []Result {
	var out []Result
	for _, r := range s.Results {
		if !r.Pass {
			out = append(out, r)
		}
	}
	return out
}
