package pipeline

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// warning is one record at Warn level or above that a run logged: its
// message and attributes, and the stage it is about ("" for the run).
type warning struct {
	stage string
	msg   string
	attrs []warnAttr // in the order they were given, group names joined with "."
}

type warnAttr struct{ key, value string }

// text is the warning in one line, as the Report and the warning event's
// Reason carry it: the message, then key=value for each attribute in the
// order they were given, a value quoted (Go syntax) where it is empty or
// holds a space, '=', '"' or an unprintable rune, as slog's text handler
// does.
func (w warning) text() string {
	var b strings.Builder
	b.WriteString(w.msg)
	for _, a := range w.attrs {
		b.WriteByte(' ')
		b.WriteString(a.key)
		b.WriteByte('=')
		if a.value == "" || strings.ContainsFunc(a.value, func(r rune) bool {
			return r == ' ' || r == '=' || r == '"' || !unicode.IsPrint(r)
		}) {
			b.WriteString(strconv.Quote(a.value))
		} else {
			b.WriteString(a.value)
		}
	}
	return b.String()
}

// attrMap is the warning's attributes by key (the last one given wins),
// nil if it has none.
func (w warning) attrMap() map[string]string {
	if len(w.attrs) == 0 {
		return nil
	}
	m := make(map[string]string, len(w.attrs))
	for _, a := range w.attrs {
		m[a.key] = a.value
	}
	return m
}

// warnHandler is the handler of a run's logger. It passes every record to
// the handler it wraps (the user's log: the line on stderr stays) and
// hands each one at Warn or above, enabled there or not, to warned, which
// makes it an event and a line of the Report. The stage a warning is
// about is the "stage" attribute outside any group, given to With (the
// logger each stage gets: Env.Log) or to the record itself (the runner's
// own warnings); the record's wins.
type warnHandler struct {
	next   slog.Handler
	warned func(warning)
	stage  string     // the "stage" given to With
	attrs  []warnAttr // the other attributes given to With
	prefix string     // the groups opened by WithGroup: "g1.g2."
}

func newWarnHandler(next slog.Handler, warned func(warning)) *warnHandler {
	return &warnHandler{next: next, warned: warned}
}

func (h *warnHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || h.next.Enabled(ctx, l)
}

func (h *warnHandler) Handle(ctx context.Context, rec slog.Record) error {
	var err error
	if h.next.Enabled(ctx, rec.Level) {
		err = h.next.Handle(ctx, rec)
	}
	if rec.Level >= slog.LevelWarn {
		w := warning{stage: h.stage, msg: rec.Message, attrs: slices.Clip(h.attrs)}
		rec.Attrs(func(a slog.Attr) bool {
			w.stage, w.attrs = addWarnAttr(w.stage, w.attrs, h.prefix, a)
			return true
		})
		h.warned(w)
	}
	return err
}

func (h *warnHandler) WithAttrs(as []slog.Attr) slog.Handler {
	if len(as) == 0 {
		return h
	}
	c := *h
	c.next = h.next.WithAttrs(as)
	// Clipped: an append must not write into the array that h and the
	// other handlers made from it share.
	c.attrs = slices.Clip(h.attrs)
	for _, a := range as {
		c.stage, c.attrs = addWarnAttr(c.stage, c.attrs, h.prefix, a)
	}
	return &c
}

func (h *warnHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h // slog: the group is ignored
	}
	c := *h
	c.next = h.next.WithGroup(name)
	c.prefix = h.prefix + name + "."
	return &c
}

// addWarnAttr adds a to attrs under prefix, or takes it as the stage: a
// "stage" outside any group. A group's attributes are added one by one,
// under its name; empty attributes are dropped, as slog's handlers do.
func addWarnAttr(stage string, attrs []warnAttr, prefix string, a slog.Attr) (string, []warnAttr) {
	a.Value = a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return stage, attrs
	}
	if a.Value.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p += a.Key + "."
		}
		for _, g := range a.Value.Group() {
			stage, attrs = addWarnAttr(stage, attrs, p, g)
		}
		return stage, attrs
	}
	if prefix == "" && a.Key == "stage" {
		return a.Value.String(), attrs
	}
	v := a.Value.String()
	if a.Value.Kind() == slog.KindTime {
		v = a.Value.Time().Format("2006-01-02T15:04:05.000Z07:00") // as slog's text handler writes it
	}
	return stage, append(attrs, warnAttr{prefix + a.Key, v})
}
