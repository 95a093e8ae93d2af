package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/ferry-llm/ferry/internal/jsonout"
	"github.com/ferry-llm/ferry/internal/progress"
	"github.com/ferry-llm/ferry/pipeline"
)

// How `ferry pipeline run` shows a long run: on a terminal, one display
// (a line per stage as it starts, is skipped or ends, with its time and
// outputs, and a byte bar "[k/n] stage" per running stage with its rate
// and time left); elsewhere plain log lines; with --events, one JSON
// object a line on stdout (pipeline.Event) for scripts.

// steps remembers each stage's place in the run ("k/n") from the events.
type steps struct {
	mu    sync.Mutex
	index map[string][2]int
}

func (s *steps) note(e pipeline.Event) {
	if e.Stage == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.index == nil {
		s.index = map[string][2]int{}
	}
	s.index[e.Stage] = [2]int{e.Index, e.Total}
}

func (s *steps) of(stage string) (int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.index[stage]
	return v[0], v[1]
}

// display draws a run's events on a terminal, above the progress bars.
type display struct {
	steps
	pg   *progress.Group
	name string
}

func (d *display) event(e pipeline.Event) {
	d.note(e)
	step := fmt.Sprintf("[%d/%d] %s (%s)", e.Index, e.Total, e.Stage, e.Kind)
	switch e.Event {
	case pipeline.EventStart:
		d.pg.Println(fmt.Sprintf("pipeline %s: %s", d.name, plural(e.Total, "stage")))
	case pipeline.EventSkip:
		d.pg.Println(fmt.Sprintf("  = %s: %s, %s, %s", step, e.Reason, plural(len(e.Outputs), "output"), pipeline.FormatBytes(e.Bytes)))
	case pipeline.EventWaiting:
		d.pg.Println(fmt.Sprintf("  … %s: waiting (%s)", step, e.Reason))
	case pipeline.EventShared:
		d.pg.Println(fmt.Sprintf("  ↑ %s: %s in %s, %s", step, e.Reason, formatSeconds(e.Seconds), pipeline.FormatBytes(e.Bytes)))
	case pipeline.EventRun:
		d.pg.Println(fmt.Sprintf("  > %s: %s", step, e.Reason))
	case pipeline.EventDone:
		d.pg.Println(fmt.Sprintf("  ✓ %s: done in %s, %s, %s -> %s", step, formatSeconds(e.Seconds),
			plural(len(e.Outputs), "output"), pipeline.FormatBytes(e.Bytes), e.View))
	case pipeline.EventFailed:
		d.pg.Println(fmt.Sprintf("  ✗ %s: failed: %s", step, e.Error))
	case pipeline.EventInterrupted:
		d.pg.Println(fmt.Sprintf("  ! %s: interrupted after %s; %s", step, formatSeconds(e.Seconds), e.Reason))
	case pipeline.EventBlocked:
		d.pg.Println(fmt.Sprintf("  - %s: blocked: %s", step, e.Reason))
	case pipeline.EventWarning:
		// Not drawn: its log line is on the terminal already, above the
		// bars (the progress group logs through them).
	}
}

// bar starts the progress bar of a running stage, named by its step.
func (d *display) bar(stage string) pipeline.Progress {
	k, n := d.of(stage)
	return d.pg.New(fmt.Sprintf("[%d/%d] %s", k, n, stage), -1, "stage", stage)
}

// shareBar starts the progress bar of a stage's upload to the shared
// store ("[k/n] stage ↑"), beside its own bar while it runs.
func (d *display) shareBar(stage string) pipeline.Progress {
	k, n := d.of(stage)
	return d.pg.New(fmt.Sprintf("[%d/%d] %s ↑", k, n, stage), -1, "stage", stage, "phase", pipeline.PhaseShare)
}

// plainBars are the progress reporters of stages and of their uploads
// as plain lines (a log, or progress events): "stage" names the stage,
// and an upload's lines also have "phase" share.
func plainBars(pg *progress.Group) (stage, share func(string) pipeline.Progress) {
	stage = func(s string) pipeline.Progress { return pg.New(s, -1, "stage", s) }
	share = func(s string) pipeline.Progress {
		return pg.New(s+" ↑", -1, "stage", s, "phase", pipeline.PhaseShare)
	}
	return stage, share
}

// eventStream writes events as JSON lines, one at a time; progress events
// come from a progress group whose plain lines it receives.
type eventStream struct {
	steps
	mu    sync.Mutex
	w     io.Writer
	ended bool
	err   error // the first write error
}

func (s *eventStream) event(e pipeline.Event) {
	s.note(e)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = s.ended || e.Event == pipeline.EventEnd
	if err := jsonout.Line(s.w, e); err != nil && s.err == nil {
		s.err = err
	}
}

// progressLine turns a plain progress line of stage attrs into an event.
func (s *eventStream) progressLine(attrs []any, snap progress.Snapshot) {
	stage, phase := "", ""
	for i := 0; i+1 < len(attrs); i += 2 {
		switch attrs[i] {
		case "stage":
			stage, _ = attrs[i+1].(string)
		case "phase":
			phase, _ = attrs[i+1].(string)
		}
	}
	k, n := s.of(stage)
	s.event(pipeline.Event{Time: time.Now().UTC(), Event: pipeline.EventProgress, Stage: stage, Phase: phase, Index: k, Total: n,
		Bytes: snap.Done, Of: snap.Total, Rate: snap.Rate, ETA: snap.ETA.Seconds()})
}

// end writes the end event of a run that stopped before it started
// (a refused plan, a lock not taken), run under ctx: scripts always get
// one.
func (s *eventStream) end(ctx context.Context, rep *pipeline.Report, err error) {
	s.mu.Lock()
	ended := s.ended
	s.mu.Unlock()
	if ended {
		return
	}
	e := pipeline.Event{Time: time.Now().UTC(), Event: pipeline.EventEnd, Report: rep}
	if err != nil {
		e.Error = strings.TrimSpace(errorMessage(ctx, err)) // as the user reads it on stderr
	}
	s.event(e)
}
