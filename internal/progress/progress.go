// Package progress is ferry's one progress reporter for long commands and
// pipeline stages: on a terminal a byte bar per running task
// (schollz/progressbar/v3), drawn below the log lines; anywhere else
// (a log file, CI) a plain log line per task every Interval with the bytes
// done, the rate and the time left.
package progress

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// Reporter receives one task's byte counts; its methods may be called from
// several goroutines.
type Reporter interface {
	SetTotal(n int64) // total bytes, ≤ 0 when not known
	Add(n int64)      // bytes done since the last call
	Close() error     // the task ended (done or not)
}

// DefaultInterval is how often plain lines are logged.
const DefaultInterval = 10 * time.Second

// IntervalEnv, a Go duration ("2s"), overrides DefaultInterval in the CLI.
const IntervalEnv = "FERRY_PROGRESS_INTERVAL"

// Options tune a Group.
type Options struct {
	// Interval between plain lines (0: DefaultInterval).
	Interval time.Duration
	// Summary logs a last plain line for every task when it closes, even
	// one shorter than Interval (a pipeline's log then has each stage's
	// bytes and rate). Without it a task that ends before its first line
	// logs nothing.
	Summary bool
	// Line, if set, receives the plain lines instead of the default
	// logger (a JSON event stream): the task's attrs and its figures.
	// The group then never draws bars, terminal or not.
	Line func(attrs []any, s Snapshot)
}

// Snapshot is a task's figures at one plain line.
type Snapshot struct {
	Done, Total int64 // bytes; Total ≤ 0 when not known
	Rate        float64
	ETA         time.Duration // 0 when not known
	Last        bool          // the line at Close
}

// Terminal reports whether w is a terminal.
func Terminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// Group reports the tasks of one command on out (its stderr). Close it when
// the command ends.
type Group struct {
	opts    Options
	out     io.Writer
	bars    *termBars // nil when out is not a terminal
	prevLog *slog.Logger
	mu      sync.Mutex
	plain   map[*plainReporter]bool
	stop    chan struct{}
	done    chan struct{}
}

// NewGroup starts a group on out. On a terminal the default slog logger
// writes through the group until Close, so log lines appear above the bars.
func NewGroup(out io.Writer, opts Options) *Group {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	g := &Group{opts: opts, out: out, stop: make(chan struct{}), done: make(chan struct{}), plain: map[*plainReporter]bool{}}
	if Terminal(out) && opts.Line == nil {
		g.bars = newTermBars(out)
		level := slog.LevelInfo
		if slog.Default().Enabled(context.Background(), slog.LevelDebug) {
			level = slog.LevelDebug
		}
		g.prevLog = slog.Default()
		slog.SetDefault(slog.New(slog.NewTextHandler(g.bars, &slog.HandlerOptions{Level: level})))
		close(g.done)
		return g
	}
	go g.tick()
	return g
}

// New starts the reporter of one task: name describes its bar; attrs name
// it in plain lines ("stage", name). total ≤ 0 is not known yet.
func (g *Group) New(name string, total int64, attrs ...any) Reporter {
	if g.bars != nil {
		return g.bars.newBar(name, total)
	}
	now := time.Now()
	p := &plainReporter{g: g, attrs: attrs, total: total, start: now, last: now}
	g.mu.Lock()
	g.plain[p] = true
	g.mu.Unlock()
	return p
}

// Terminal reports whether g draws bars on a terminal.
func (g *Group) Terminal() bool { return g.bars != nil }

// Println writes a line to the group's output, above the bars on a
// terminal.
func (g *Group) Println(line string) {
	if g.bars != nil {
		g.bars.Write([]byte(line + "\n"))
		return
	}
	io.WriteString(g.out, line+"\n")
}

// Close ends the group: bars are cleared and the default logger restored.
func (g *Group) Close() {
	if g.bars != nil {
		g.bars.close()
		slog.SetDefault(g.prevLog)
		return
	}
	close(g.stop)
	<-g.done
}

func (g *Group) tick() {
	defer close(g.done)
	t := time.NewTicker(g.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
			g.mu.Lock()
			ps := make([]*plainReporter, 0, len(g.plain))
			for p := range g.plain {
				ps = append(ps, p)
			}
			g.mu.Unlock()
			for _, p := range ps {
				p.line(false)
			}
		}
	}
}

// plainReporter logs "progress" lines: bytes, of, pct, rate, eta.
type plainReporter struct {
	g      *Group
	attrs  []any
	logMu  sync.Mutex
	mu     sync.Mutex
	start  time.Time
	total  int64
	done   int64
	logged int64     // done at the last line
	last   time.Time // when the last line was logged (start before the first)
	lines  int
	closed bool
}

func (p *plainReporter) SetTotal(n int64) {
	p.mu.Lock()
	p.total = n
	p.mu.Unlock()
}

// Add logs a line itself when the interval has passed, so a busy task
// reports on time whatever the ticker's scheduling; the ticker covers a
// task that stalls.
func (p *plainReporter) Add(n int64) {
	p.mu.Lock()
	p.done += n
	due := time.Since(p.last) >= p.g.opts.Interval
	p.mu.Unlock()
	if due {
		p.line(false)
	}
}

func (p *plainReporter) Close() error {
	p.g.mu.Lock()
	delete(p.g.plain, p)
	p.g.mu.Unlock()
	p.line(true)
	return nil
}

// line logs the task's state; last is the line at Close.
func (p *plainReporter) line(last bool) {
	p.logMu.Lock() // lines leave in the order their counts were taken
	defer p.logMu.Unlock()
	p.mu.Lock()
	if p.closed || (last && p.lines == 0 && !p.g.opts.Summary) || (p.lines > 0 && p.done == p.logged) ||
		(!last && time.Since(p.last) < p.g.opts.Interval*9/10) {
		p.closed = p.closed || last
		p.mu.Unlock()
		return
	}
	p.closed = last
	p.lines++
	p.logged = p.done
	p.last = time.Now()
	done, total, elapsed := p.done, p.total, time.Since(p.start)
	p.mu.Unlock()
	rate := float64(done) / max(elapsed.Seconds(), 1e-9)
	if p.g.opts.Line != nil {
		snap := Snapshot{Done: done, Total: total, Rate: rate, Last: last}
		if total > 0 && done < total && rate > 0 {
			snap.ETA = time.Duration(float64(total-done) / rate * float64(time.Second))
		}
		p.g.opts.Line(p.attrs, snap)
		return
	}
	args := append([]any{}, p.attrs...)
	args = append(args, "bytes", done)
	if total > 0 {
		args = append(args, "of", total, "pct", done*100/total)
	}
	args = append(args, "rate", FormatRate(rate))
	if total > 0 && done < total && rate > 0 {
		args = append(args, "eta", (time.Duration(float64(total-done) / rate * float64(time.Second))).Round(time.Second).String())
	}
	slog.Info("progress", args...)
}

// FormatRate writes bytes per second in decimal units ("12.5MB/s").
func FormatRate(bps float64) string {
	units := []string{"B", "kB", "MB", "GB", "TB"}
	i := 0
	for bps >= 1000 && i < len(units)-1 {
		bps /= 1000
		i++
	}
	return fmt.Sprintf("%.1f%s/s", bps, units[i])
}

// termBars draws the bars of all running tasks, one line each, below the
// log lines: every redraw moves the cursor up over the bars drawn last
// time, clears them and draws the current ones.
type termBars struct {
	mu    sync.Mutex
	out   io.Writer
	bars  []*barReporter
	drawn int
	stop  chan struct{}
	done  chan struct{}
}

func newTermBars(out io.Writer) *termBars {
	t := &termBars{out: out, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(t.done)
		tick := time.NewTicker(150 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-t.stop:
				return
			case <-tick.C:
				t.mu.Lock()
				t.clearLocked()
				t.drawLocked()
				t.mu.Unlock()
			}
		}
	}()
	return t
}

func (t *termBars) newBar(name string, total int64) Reporter {
	if total <= 0 {
		total = -1
	}
	b := &barReporter{tb: t}
	b.bar = progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(&b.line),
		progressbar.OptionSetDescription(name),
		progressbar.OptionShowBytes(true),
		progressbar.OptionShowCount(),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond),
	)
	t.mu.Lock()
	t.bars = append(t.bars, b)
	t.mu.Unlock()
	return b
}

// Write prints p (log lines) above the bars.
func (t *termBars) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.clearLocked()
	n, err := t.out.Write(p)
	t.drawLocked()
	return n, err
}

func (t *termBars) clearLocked() {
	for ; t.drawn > 0; t.drawn-- {
		io.WriteString(t.out, "\x1b[1A\r\x1b[2K")
	}
}

func (t *termBars) drawLocked() {
	for _, b := range t.bars {
		if l := b.line.String(); l != "" {
			io.WriteString(t.out, l+"\n")
			t.drawn++
			b.shown = true
		}
	}
}

// remove takes b off the screen; a bar that ended before its first redraw
// is drawn once first, so a short task still shows on the terminal.
func (t *termBars) remove(b *barReporter) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.clearLocked()
	if !b.shown {
		t.drawLocked()
		t.clearLocked()
	}
	for i, x := range t.bars {
		if x == b {
			t.bars = append(t.bars[:i], t.bars[i+1:]...)
			break
		}
	}
	t.drawLocked()
}

func (t *termBars) close() {
	close(t.stop)
	<-t.done
	t.mu.Lock()
	t.clearLocked()
	t.mu.Unlock()
}

type barReporter struct {
	tb    *termBars
	bar   *progressbar.ProgressBar
	line  lineCapture
	shown bool // guarded by tb.mu
}

// Describe names what r is working on now (the tensor a quantizer is on)
// where r shows a name: a bar on a terminal. Plain lines keep the task's
// attrs; r of another kind is left alone.
func Describe(r Reporter, what string) {
	if b, ok := r.(*barReporter); ok {
		b.bar.Describe(what)
	}
}

func (b *barReporter) SetTotal(n int64) { b.bar.ChangeMax64(n) }
func (b *barReporter) Add(n int64)      { b.bar.Add64(n) }
func (b *barReporter) Close() error     { b.tb.remove(b); return nil }

// lineCapture keeps the last line a progress bar rendered: a one-line
// terminal where "\r" starts the line over.
type lineCapture struct {
	mu   sync.Mutex
	line []byte
}

func (l *lineCapture) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range p {
		switch c {
		case '\r', '\n':
			l.line = l.line[:0]
		default:
			l.line = append(l.line, c)
		}
	}
	return len(p), nil
}

func (l *lineCapture) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.TrimRight(string(l.line), " ")
}
