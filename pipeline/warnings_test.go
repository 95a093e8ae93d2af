package pipeline

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"maps"
	"testing"
	"time"
)

// The run's logger hands each record at Warn or above to the run with the
// stage it is about, however the stage was given, and passes every record
// on to the log it wraps.
func TestWarnHandler(t *testing.T) {
	type want struct {
		stage, text string
		attrs       map[string]string
	}
	for _, c := range []struct {
		name string
		log  func(l *slog.Logger)
		want []want
	}{
		{"the stage of With", func(l *slog.Logger) { l.With("stage", "x").Warn("m", "n", 1) },
			[]want{{"x", "m n=1", map[string]string{"n": "1"}}}},
		{"the stage after another attribute", func(l *slog.Logger) { l.With("other", 1).With("stage", "y").Warn("m") },
			[]want{{"y", "m other=1", map[string]string{"other": "1"}}}},
		{"the stage before another attribute", func(l *slog.Logger) { l.With("stage", "y").With("other", 1).Warn("m") },
			[]want{{"y", "m other=1", map[string]string{"other": "1"}}}},
		{"the record's stage", func(l *slog.Logger) { l.Warn("m", "stage", "z", "err", errors.New("no such file")) },
			[]want{{"z", `m err="no such file"`, map[string]string{"err": "no such file"}}}},
		{"the record's stage over With's", func(l *slog.Logger) { l.With("stage", "x").Warn("m", "stage", "z") },
			[]want{{"z", "m", nil}}},
		{"Info is not a warning", func(l *slog.Logger) { l.With("stage", "x").Info("m") }, nil},
		{"Debug is not a warning", func(l *slog.Logger) { l.With("stage", "x").Debug("m") }, nil},
		{"Error is one", func(l *slog.Logger) { l.Error("m") }, []want{{"", "m", nil}}},
		{"a group keeps the stage", func(l *slog.Logger) { l.With("stage", "x").WithGroup("g").Warn("m", "k", "v") },
			[]want{{"x", "m g.k=v", map[string]string{"g.k": "v"}}}},
		{"a group then the stage", func(l *slog.Logger) { l.WithGroup("g").With("k", 1).WithGroup("h").Warn("m", "j", 2) },
			[]want{{"", "m g.k=1 g.h.j=2", map[string]string{"g.k": "1", "g.h.j": "2"}}}},
		{"a stage inside a group is an attribute", func(l *slog.Logger) { l.WithGroup("g").Warn("m", "stage", "s") },
			[]want{{"", "m g.stage=s", map[string]string{"g.stage": "s"}}}},
		{"an empty group name is no group", func(l *slog.Logger) { l.WithGroup("").With("stage", "x").Warn("m") },
			[]want{{"x", "m", nil}}},
		{"a group attribute", func(l *slog.Logger) { l.Warn("m", slog.Group("req", "id", 7, slog.Group("", "inline", true))) },
			[]want{{"", "m req.id=7 req.inline=true", map[string]string{"req.id": "7", "req.inline": "true"}}}},
		{"values quoted as slog's text handler does", func(l *slog.Logger) {
			l.Warn("m", "path", "a b", "empty", "", "eq", "k=v", "plain", "x/y…", "when", time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), "took", 1500*time.Millisecond)
		}, []want{{"", `m path="a b" empty="" eq="k=v" plain=x/y… when=2025-01-02T03:04:05.000Z took=1.5s`,
			map[string]string{"path": "a b", "empty": "", "eq": "k=v", "plain": "x/y…", "when": "2025-01-02T03:04:05.000Z", "took": "1.5s"}}}},
		{"loggers made from one do not share attributes", func(l *slog.Logger) {
			// base's attributes have room to grow: a handler that appended
			// to them in place would give h1 h2's attribute.
			base := l.With("a", 1, "b", 2).With("c", 3)
			h1 := base.With("stage", "one", "d", 4)
			h2 := base.With("stage", "two", "e", 5)
			h1.Warn("m1")
			h2.Warn("m2")
			base.Warn("m3")
		}, []want{{"one", "m1 a=1 b=2 c=3 d=4", nil}, {"two", "m2 a=1 b=2 c=3 e=5", nil}, {"", "m3 a=1 b=2 c=3", nil}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got []warning
			var logged, plain bytes.Buffer
			c.log(slog.New(newWarnHandler(textHandler(&logged, slog.LevelDebug), func(w warning) { got = append(got, w) })))
			if len(got) != len(c.want) {
				t.Fatalf("%d warnings %+v, want %d", len(got), got, len(c.want))
			}
			for i, w := range c.want {
				if got[i].stage != w.stage || got[i].text() != w.text {
					t.Errorf("warning %d: stage %q, %q; want %q, %q", i, got[i].stage, got[i].text(), w.stage, w.text)
				}
				if w.attrs != nil && !maps.Equal(got[i].attrMap(), w.attrs) {
					t.Errorf("warning %d: attrs %v, want %v", i, got[i].attrMap(), w.attrs)
				}
			}
			// The log says what it says without the wrapper.
			c.log(slog.New(textHandler(&plain, slog.LevelDebug)))
			if logged.String() != plain.String() {
				t.Errorf("logged\n%s\nwant\n%s", logged.String(), plain.String())
			}
		})
	}

	// A warning the log does not show (its level is Error) is still one.
	var got []warning
	var logged bytes.Buffer
	slog.New(newWarnHandler(textHandler(&logged, slog.LevelError), func(w warning) { got = append(got, w) })).With("stage", "x").Warn("m")
	if len(got) != 1 || got[0].stage != "x" || logged.Len() != 0 {
		t.Errorf("under a log at Error: %+v, logged %q", got, logged.String())
	}
}

// textHandler is slog's text handler on w from level, without times.
func textHandler(w io.Writer, level slog.Level) slog.Handler {
	return slog.NewTextHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}})
}
