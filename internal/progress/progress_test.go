package progress

import (
	"bytes"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer the ticker goroutine and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func captureLog(t *testing.T) *syncBuffer {
	t.Helper()
	var buf syncBuffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	return &buf
}

// Not a terminal: a plain line every interval with the bytes done, the
// total, the rate and the time left, and a last one when the task closes.
func TestPlainLinesArePeriodic(t *testing.T) {
	log := captureLog(t)
	var out bytes.Buffer // not a terminal
	g := NewGroup(&out, Options{Interval: 30 * time.Millisecond})
	r := g.New("merging", 1000, "task", "merge")
	line := regexp.MustCompile(`msg=progress task=merge bytes=(\d+) of=1000 pct=\d+ rate=\d+\.\d[kMGT]?B/s eta=\S+`)
	for i := 0; i < 4; i++ {
		r.Add(100)
		deadline := time.Now().Add(5 * time.Second)
		for len(line.FindAllString(log.String(), -1)) <= i {
			if time.Now().After(deadline) {
				t.Fatalf("no line %d after adding %d bytes: %q", i+1, (i+1)*100, log.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	time.Sleep(100 * time.Millisecond) // no progress: no repeated line
	if n := len(line.FindAllString(log.String(), -1)); n != 4 {
		t.Errorf("%d lines for 4 steps: %q", n, log.String())
	}
	r.Add(600)
	r.Close()
	g.Close()
	if !strings.Contains(log.String(), "bytes=1000 of=1000 pct=100 rate=") {
		t.Errorf("no last line at 100%%: %q", log.String())
	}
	if out.Len() != 0 {
		t.Errorf("plain mode wrote to the output itself: %q", out.String())
	}
}

// A task shorter than the interval logs nothing, unless the group keeps a
// summary per task (pipeline stages).
func TestPlainShortTask(t *testing.T) {
	for _, summary := range []bool{false, true} {
		log := captureLog(t)
		g := NewGroup(&bytes.Buffer{}, Options{Interval: time.Hour, Summary: summary})
		r := g.New("s", 0, "stage", "s")
		r.Add(42)
		r.Close()
		g.Close()
		got := log.String()
		if summary != strings.Contains(got, "msg=progress stage=s bytes=42 rate=") {
			t.Errorf("summary %v: %q", summary, got)
		}
		if strings.Contains(got, "eta=") {
			t.Errorf("an ETA without a total: %q", got)
		}
	}
}

func TestFormatRate(t *testing.T) {
	for bps, want := range map[float64]string{0: "0.0B/s", 999: "999.0B/s", 1500: "1.5kB/s", 2.5e9: "2.5GB/s"} {
		if got := FormatRate(bps); got != want {
			t.Errorf("FormatRate(%g) = %q, want %q", bps, got, want)
		}
	}
}

// With Line the plain lines go to it, not to the log, with the figures
// (and the last one at Close, with Summary), even on what could be a
// terminal.
func TestLineSink(t *testing.T) {
	log := captureLog(t)
	var mu sync.Mutex
	var got []Snapshot
	g := NewGroup(&bytes.Buffer{}, Options{Interval: time.Hour, Summary: true, Line: func(attrs []any, s Snapshot) {
		if len(attrs) != 2 || attrs[1] != "x" {
			t.Errorf("attrs %v", attrs)
		}
		mu.Lock()
		got = append(got, s)
		mu.Unlock()
	}})
	if g.Terminal() {
		t.Error("a Line group draws bars")
	}
	r := g.New("x", 1000, "stage", "x")
	r.Add(400)
	r.Close()
	g.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || !got[0].Last || got[0].Done != 400 || got[0].Total != 1000 || got[0].Rate <= 0 || got[0].ETA <= 0 {
		t.Errorf("snapshots %+v", got)
	}
	if log.String() != "" {
		t.Errorf("logged: %q", log.String())
	}
}
