package worker

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// logStderr logs one line a worker wrote to its standard error, with attrs. A
// line that is a log record in slog's text form (key=value pairs with a level
// and a msg, as the stage library writes them) is logged as that record: its
// level, its message and its other pairs as attributes. Logged whole as the
// message, it would be quoted a second time in a text log (msg="level=WARN
// msg=\"...\""). Any other line is logged whole as the message, at warn.
//
// own are the pairs log already carries (the worker's stage, pid and worker
// id). A record's pair whose key is one of own's or attrs' never makes a
// second key of that name: with the same value it is dropped (it says
// nothing new: the stage library logs its stage), with another it is kept as
// "stderr."+key. A JSON record naming a key twice is refused by strict
// readers, and others keep the last one, so a stage's pid=... (of a child it
// ran) would pass for the worker's.
func logStderr(log *slog.Logger, own []any, line string, attrs ...any) {
	level, msg, pairs, ok := parseRecord(line)
	if !ok {
		log.Warn(line, attrs...)
		return
	}
	log.Log(context.Background(), level, msg, append(renamePairs(pairs, own, attrs), attrs...)...)
}

// renamePairs returns pairs, string keys and values, without those that
// repeat a key and value of own or attrs, and with the key of one that gives
// such a key another value prefixed "stderr.".
func renamePairs(pairs []any, own, attrs []any) []any {
	taken := make(map[string]string, (len(own)+len(attrs))/2)
	for _, kvs := range [][]any{own, attrs} {
		for i := 0; i+1 < len(kvs); i += 2 {
			if k, ok := kvs[i].(string); ok {
				taken[k] = fmt.Sprint(kvs[i+1])
			}
		}
	}
	out := make([]any, 0, len(pairs))
	for i := 0; i+1 < len(pairs); i += 2 {
		k, v := pairs[i].(string), pairs[i+1]
		if have, ok := taken[k]; ok {
			if have == v {
				continue
			}
			k = "stderr." + k
		}
		out = append(out, k, v)
	}
	return out
}

// parseRecord reads a line in slog's text form: key=value pairs separated by
// single spaces, a value either bare or a Go-quoted string. ok is false for
// any other line, or one without a msg or a level slog knows.
func parseRecord(line string) (level slog.Level, msg string, pairs []any, ok bool) {
	haveLevel, haveMsg := false, false
	for rest := line; rest != ""; {
		key, after, found := strings.Cut(rest, "=")
		if !found || key == "" || strings.ContainsAny(key, " \"") {
			return 0, "", nil, false
		}
		var value string
		if value, rest, found = cutValue(after); !found {
			return 0, "", nil, false
		}
		switch key {
		case slog.TimeKey:
		case slog.LevelKey:
			if level.UnmarshalText([]byte(value)) != nil {
				return 0, "", nil, false
			}
			haveLevel = true
		case slog.MessageKey:
			msg, haveMsg = value, true
		default:
			pairs = append(pairs, key, value)
		}
	}
	return level, msg, pairs, haveLevel && haveMsg
}

// cutValue reads the value at the start of s, up to the space before the next
// pair, and returns it unquoted, and what follows that space.
func cutValue(s string) (value, rest string, ok bool) {
	if !strings.HasPrefix(s, `"`) {
		value, rest, _ = strings.Cut(s, " ")
		return value, rest, !strings.Contains(value, `"`)
	}
	quoted, err := strconv.QuotedPrefix(s)
	if err != nil {
		return "", "", false
	}
	value, err = strconv.Unquote(quoted)
	rest = s[len(quoted):]
	if err != nil || rest != "" && rest[0] != ' ' {
		return "", "", false
	}
	return value, strings.TrimPrefix(rest, " "), true
}

// A worker's standard error is logged at most stderrRate lines a second on
// average, in bursts of up to stderrBurst, a line counting one more for
// each whole KiB it holds (so long lines are bounded in bytes too: about 1
// MiB a second, 10 MiB at once); the lines past that are dropped and
// counted. Each line costs the dispatcher's one processor a few
// microseconds of formatting and writing, and the log its bytes, so a stage
// that floods its standard error (a debug loop, a traceback per message)
// would otherwise slow every other stage's answers and fill the disk:
// `yes >&2` for 8 s made 190 MB of log. Ordinary stages, which log a line
// per problem (docs/protocol.md), never come near it.
const (
	stderrRate  = 1000
	stderrBurst = 10000
	// stderrDropReport is how often a worker whose lines are being dropped
	// says how many, while it goes on.
	stderrDropReport = 10 * time.Second
)

// stderrGate decides which of one worker's standard error lines are logged
// (pass) and reports those it dropped, in one line at most every
// stderrDropReport: with the first line read that long after the first
// drop not yet reported, or, if the worker falls silent first, when a timer
// armed at that drop goes off (a stage that flooded and then waits for its
// next message would otherwise hold its count until it exits, hiding from
// the operator that lines are missing); and when the worker's standard
// error ends (close). pass and close are called by that worker's reading
// goroutine alone; the timer's report runs on its own, hence mu.
type stderrGate struct {
	log   *slog.Logger
	limit *rate.Limiter
	// afterFunc arms the silent report's timer: time.AfterFunc, but for
	// tests.
	afterFunc func(time.Duration, func()) interface{ Stop() bool }

	mu      sync.Mutex
	dropped int64
	since   time.Time // of the first drop not yet reported
	armed   interface{ Stop() bool }
	gen     int // of armed: a timer that fires after its drops were reported says nothing
}

func newStderrGate(log *slog.Logger) *stderrGate {
	return &stderrGate{log: log, limit: rate.NewLimiter(stderrRate, stderrBurst),
		afterFunc: func(d time.Duration, f func()) interface{ Stop() bool } { return time.AfterFunc(d, f) }}
}

// pass says whether a line of size bytes read at now is to be logged.
func (g *stderrGate) pass(now time.Time, size int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	ok := g.limit.AllowN(now, 1+size/1024)
	if !ok {
		if g.dropped == 0 {
			g.since = now
			gen := g.gen
			g.armed = g.afterFunc(stderrDropReport, func() { g.timed(gen) })
		}
		g.dropped++
	}
	if g.dropped > 0 && now.Sub(g.since) >= stderrDropReport {
		g.report()
	}
	return ok
}

// timed is the silent report of the drops counted since the timer of gen was
// armed, unless they were reported already.
func (g *stderrGate) timed(gen int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gen == g.gen {
		g.report()
	}
}

// close reports what is still unreported.
func (g *stderrGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.report()
}

// report says how many lines were dropped since the last report, if any, and
// disarms the timer; with g.mu held.
func (g *stderrGate) report() {
	if g.dropped == 0 {
		return
	}
	g.log.Warn("worker's standard error: lines dropped, over the limit", "stream", "stderr",
		"dropped", g.dropped, "limit_per_second", stderrRate, "burst", stderrBurst)
	g.dropped = 0
	g.gen++
	g.armed.Stop()
	g.armed = nil
}
