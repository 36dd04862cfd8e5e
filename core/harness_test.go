package core_test

import (
	"context"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/sim/fakequeue"
)

var update = flag.Bool("update", false, "rewrite testdata/scenarios/*.golden from the current core")

// epoch is the scenario clock's zero; transcripts show offsets from it.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// world drives the real core the way the shell does: queue commands are executed
// against the fake queue and their results fed back, spawns are answered with
// WorkerStarted, and what each worker was handed is tracked so tests can answer.
// Everything that crosses the core's boundary is written to a transcript, which is
// compared with testdata/scenarios/<test>.golden.
type world struct {
	t       *testing.T
	cfg     *conf.Config
	c       *core.Core
	q       *fakequeue.Queue
	now     time.Time
	pending []core.Event
	life    int64 // the Life of the current core (restart counts them)
	held    map[core.WorkerID][]int64
	stageOf map[core.WorkerID]string
	alive   map[core.WorkerID]bool
	all     []core.Command // every command, for assertions
	trace   strings.Builder
	// noAutoStart: leave Spawn unanswered (tests that answer SpawnFailed).
	noAutoStart bool
	// failQueue: fail every queue transaction with this text (before it applies).
	failQueue string
	// abortQueue: failQueue, and the shell knows the transaction did not
	// commit (core.Claimed.Aborted).
	abortQueue bool
	// loseReplies: apply the queue transaction but report failure.
	loseReplies bool
	// timer: the core's last SetTimer, as unwatched follows it.
	timer time.Time
	// replyAfter: each queue transaction's reply arrives this long after
	// the transaction was sent (the clock moves on by as much).
	replyAfter time.Duration
	// deferTxns: queue transactions wait in out, unapplied, until reply
	// applies one (SESSIONS above 1: the test chooses the order in which
	// they commit and answer).
	deferTxns bool
	out       [][]core.Command
}

func newWorld(t *testing.T, config string) *world {
	t.Helper()
	cfg, err := conf.Parse("test.conf", config)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	w := &world{t: t, cfg: cfg, c: core.New(cfg), q: fakequeue.New(), now: epoch,
		held: map[core.WorkerID][]int64{}, stageOf: map[core.WorkerID]string{}, alive: map[core.WorkerID]bool{}}
	fmt.Fprintf(&w.trace, "# config\n%s\n", strings.TrimSpace(config))
	t.Cleanup(w.checkGolden)
	return w
}

// at moves the clock to epoch+d (never backwards).
func (w *world) at(d time.Duration) *world {
	if t := epoch.Add(d); t.After(w.now) {
		w.now = t
	}
	return w
}

// step feeds events to the core, executes what it asks, and keeps feeding the
// results back until it asks for nothing more at this instant. It returns every
// command issued.
func (w *world) step(evs ...core.Event) []core.Command {
	w.t.Helper()
	var issued []core.Command
	w.pending = append(w.pending, evs...)
	for round := 0; len(w.pending) > 0; round++ {
		if round > 50 {
			w.t.Fatalf("core did not settle at %s", w.now.Sub(epoch))
		}
		batch := w.pending
		w.pending = nil
		var names []string
		for _, ev := range batch {
			names = append(names, ev.String())
		}
		fmt.Fprintf(&w.trace, "@%s %s\n", w.now.Sub(epoch), strings.Join(names, " | "))
		cmds := w.c.Step(w.now, batch...)
		var txn []core.Command
		for _, cmd := range cmds {
			fmt.Fprintf(&w.trace, "  %s\n", cmd)
			switch c := cmd.(type) {
			case core.Spawn:
				w.stageOf[c.Worker] = c.Stage
				w.alive[c.Worker] = true
				if !w.noAutoStart {
					w.pending = append(w.pending, core.WorkerStarted{Worker: c.Worker, PID: 1000 + int(c.Worker)})
				}
			case core.Write:
				w.held[c.Worker] = append(w.held[c.Worker], c.IDs...)
			case core.Rest:
				// A gate no producer holds: granted at once.
				w.pending = append(w.pending, core.Resting{})
			}
			if core.IsQueue(cmd) {
				txn = append(txn, cmd)
			}
		}
		if len(txn) > 0 && w.deferTxns {
			fmt.Fprintf(&w.trace, "  ~ transaction %d waits\n", len(w.out))
			w.out = append(w.out, txn)
		} else if len(txn) > 0 {
			switch {
			case w.failQueue != "" && w.abortQueue:
				w.pending = append(w.pending, fakequeue.Aborted(txn, w.failQueue)...)
			case w.failQueue != "":
				w.pending = append(w.pending, fakequeue.Failed(txn, w.failQueue)...)
			case w.loseReplies:
				w.q.Exec(context.Background(), txn)
				w.pending = append(w.pending, fakequeue.Failed(txn, "connection reset after commit")...)
			default:
				w.pending = append(w.pending, w.q.Exec(context.Background(), txn)...)
			}
			w.now = w.now.Add(w.replyAfter)
		}
		issued = append(issued, cmds...)
	}
	w.all = append(w.all, issued...)
	return issued
}

// apply commits the deferred transaction i (see deferTxns) in the fake
// queue and returns its results, which the core has not heard yet.
func (w *world) apply(i int) []core.Event {
	w.t.Helper()
	if i >= len(w.out) || w.out[i] == nil {
		w.t.Fatalf("no transaction %d waits", i)
	}
	txn := w.out[i]
	w.out[i] = nil
	fmt.Fprintf(&w.trace, "  ~ transaction %d commits\n", i)
	return w.q.Exec(context.Background(), txn)
}

// reply commits the deferred transaction i and hands its results to the core.
func (w *world) reply(i int) []core.Command {
	w.t.Helper()
	return w.step(w.apply(i)...)
}

// drain commits and answers every deferred transaction, in the order sent,
// and those the answers lead to, until none waits.
func (w *world) drain() {
	w.t.Helper()
	for i := 0; i < len(w.out); i++ {
		if w.out[i] != nil {
			w.reply(i)
		}
	}
}

// restart replaces the core by a new one over the same queue, as the shell does
// after losing the lock: the old workers are gone, carry is the old core's
// Unflushed.
func (w *world) restart(carry []core.Flush) []core.Command {
	fmt.Fprintf(&w.trace, "# new core\n")
	w.c = core.New(w.cfg)
	w.pending = nil
	clear(w.held)
	clear(w.alive)
	w.life++ // every core is a new life: the first is 0
	return w.step(core.Start{Carry: carry, Life: w.life})
}

// start runs the Start event with n messages pending at stage (if n > 0).
func (w *world) start(stage string, n int) []core.Command {
	if n > 0 {
		w.q.Insert(stage, n)
	}
	return w.step(core.Start{})
}

// head is the oldest unanswered id handed to worker wid.
func (w *world) head(wid core.WorkerID) int64 {
	w.t.Helper()
	if len(w.held[wid]) == 0 {
		w.t.Fatalf("worker %s holds nothing", wid)
	}
	return w.held[wid][0]
}

// answer makes worker wid answer line for its head message, after the stage wrote
// the row as given (to == "" leaves the row alone).
func (w *world) answer(wid core.WorkerID, to string, status core.RowStatus, line string) []core.Command {
	w.t.Helper()
	id := w.head(wid)
	if to != "" {
		if !w.q.StageWrite(id, w.stageOf[wid], to, status, w.now.Add(time.Minute)) {
			w.t.Fatalf("stage write of %d failed: row is not running at %s", id, w.stageOf[wid])
		}
	}
	w.held[wid] = w.held[wid][1:]
	return w.step(core.Answer{Worker: wid, Line: line})
}

// advance: the head of wid moved to stage `to` and the worker answered 0.
func (w *world) advance(wid core.WorkerID, to string) []core.Command {
	return w.answer(wid, to, core.StatusRunning, "0")
}

// finish: the head of wid is done and the worker answered 0.
func (w *world) finish(wid core.WorkerID) []core.Command {
	return w.answer(wid, w.stageOf[wid], core.StatusDone, "0")
}

func (w *world) exit(wid core.WorkerID, code int, signal string) []core.Command {
	w.held[wid] = nil
	w.alive[wid] = false
	return w.step(core.WorkerExited{Worker: wid, Code: code, Signal: signal})
}

// settle lets core.RestAfter pass with a Tick, so an idle core rests (the gate
// is granted at once) and makes its last look.
func (w *world) settle() []core.Command {
	w.now = w.now.Add(core.RestAfter)
	return w.step(core.Tick{})
}

// tick advances the clock to epoch+d and delivers a Tick.
func (w *world) tick(d time.Duration) []core.Command {
	w.at(d)
	return w.step(core.Tick{})
}

func (w *world) row(id int64) fakequeue.Row {
	w.t.Helper()
	r, ok := w.q.Get(id)
	if !ok {
		w.t.Fatalf("row %d does not exist", id)
	}
	return r
}

func (w *world) wantRow(id int64, stage string, status core.RowStatus) {
	w.t.Helper()
	r := w.row(id)
	if r.Stage != stage || r.Status != status {
		w.t.Errorf("row %d is %s at %s, want %s at %s (error %q)", id, r.Status, r.Stage, status, stage, r.DispatchError)
	}
}

func (w *world) checkGolden() {
	if w.t.Failed() {
		return
	}
	name := strings.ReplaceAll(w.t.Name(), "/", "_")
	path := filepath.Join("..", "testdata", "scenarios", name+".golden")
	proves, err := provesOf(strings.Split(w.t.Name(), "/")[0])
	if err != nil {
		w.t.Fatal(err)
	}
	got := proves + w.trace.String()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			w.t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			w.t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		w.t.Fatalf("golden transcript missing (run go test ./core -update and review the diff): %v", err)
	}
	if string(want) != got {
		w.t.Errorf("transcript differs from %s (rerun with -update and review the diff):\n%s", path, firstDiff(string(want), got))
	}
}

// testDocs reads the doc comment of every test function of this package, once.
var testDocs = sync.OnceValues(func() (map[string]string, error) {
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		return nil, err
	}
	docs := map[string]string{}
	fset := token.NewFileSet()
	for _, file := range files {
		f, err := parser.ParseFile(fset, file, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Test") && fn.Doc != nil {
				docs[fn.Name.Name] = fn.Doc.Text()
			}
		}
	}
	return docs, nil
})

// provesOf is the head of test's golden transcript: the "Proves:" paragraph of
// its doc comment, each line as a "# " comment, so that the transcript says
// what it proves. A scenario without one is an error: a reader of the
// transcript, or of its diff, must not have to find the Go to learn what the
// scenario is for.
func provesOf(test string) (string, error) {
	docs, err := testDocs()
	if err != nil {
		return "", fmt.Errorf("read the tests' doc comments: %w", err)
	}
	_, proves, ok := strings.Cut(docs[test], "Proves:")
	if !ok {
		return "", fmt.Errorf("%s writes a golden transcript, but its doc comment has no \"Proves:\" paragraph saying what it proves", test)
	}
	proves, _, _ = strings.Cut(proves, "\n\n")
	var b strings.Builder
	for i, line := range strings.Split(strings.TrimSpace(proves), "\n") {
		if i == 0 {
			line = "Proves: " + line
		}
		b.WriteString(strings.TrimRight("# "+line, " ") + "\n")
	}
	return b.String(), nil
}

func firstDiff(want, got string) string {
	wl, gl := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(wl) || i < len(gl); i++ {
		var a, b string
		if i < len(wl) {
			a = wl[i]
		}
		if i < len(gl) {
			b = gl[i]
		}
		if a != b {
			return fmt.Sprintf("line %d:\n want: %s\n  got: %s", i+1, a, b)
		}
	}
	return "(no difference)"
}

// Filters over commands.

func of[T core.Command](cmds []core.Command) []T {
	var out []T
	for _, c := range cmds {
		if x, ok := c.(T); ok {
			out = append(out, x)
		}
	}
	return out
}

func one[T core.Command](t *testing.T, cmds []core.Command) T {
	t.Helper()
	xs := of[T](cmds)
	if len(xs) != 1 {
		var zero T
		t.Fatalf("want exactly one %T, got %d in:\n%s", zero, len(xs), list(cmds))
	}
	return xs[0]
}

func none[T core.Command](t *testing.T, cmds []core.Command, why string) {
	t.Helper()
	if xs := of[T](cmds); len(xs) > 0 {
		t.Fatalf("%s, but got %v in:\n%s", why, xs, list(cmds))
	}
}

func list(cmds []core.Command) string {
	var b strings.Builder
	for _, c := range cmds {
		b.WriteString("  " + c.String() + "\n")
	}
	return b.String()
}

func items(cmds []core.Command) []core.Item {
	var out []core.Item
	for _, r := range of[core.Resolve](cmds) {
		out = append(out, r.Items...)
	}
	return out
}

func itemFor(t *testing.T, cmds []core.Command, id int64) core.Item {
	t.Helper()
	for _, it := range items(cmds) {
		if it.ID == id {
			return it
		}
	}
	t.Fatalf("no resolve item for message %d in:\n%s", id, list(cmds))
	return core.Item{}
}

func capsOf(c core.Claim) map[string]int {
	m := map[string]int{}
	for _, cp := range c.Caps {
		m[cp.Stage] = cp.N
	}
	return m
}

// capsAfter is each stage's floor in claim c (core.Cap.After).
func capsAfter(c core.Claim) map[string]int64 {
	m := map[string]int64{}
	for _, cp := range c.Caps {
		m[cp.Stage] = cp.After
	}
	return m
}

func workersOf(cmds []core.Command) []core.WorkerID {
	var ids []core.WorkerID
	for _, s := range of[core.Spawn](cmds) {
		ids = append(ids, s.Worker)
	}
	slices.Sort(ids)
	return ids
}

const threeStages = `
[pepsi-dispatch]
MAX_RUNTIME = 300
WORKER_IDLE_TIMEOUT = 5
POLL_INTERVAL = 30
STATS_INTERVAL = 60
[stage-a]
PROGRAM = a
PARALLELISM = 2
QUEUE_LIMIT = 3
[stage-b]
PROGRAM = b
PARALLELISM = 1
QUEUE_LIMIT = 4
[stage-c]
PROGRAM = c
PARALLELISM = 3
QUEUE_LIMIT = 1
`

// look is a claim the core sent while unwatched drove it, and when.
type look struct {
	at    time.Time
	claim core.Claim
}

// unwatched drives the core while no producer notifies it: from one of its
// timers to the next until the clock passes until, running each of its
// transactions at once on the fake queue, and answering each Rest with
// restAnswer (nil: the Rest waits for the gate all along). It returns the
// claims the core sent, and writes each Rest and claim into the transcript.
func (w *world) unwatched(until time.Time, restAnswer core.Event) []look {
	w.t.Helper()
	var looks []look
	evs := []core.Event{core.Tick{}}
	for range 100000 {
		cmds := w.c.Step(w.now, evs...)
		evs = nil
		var txn []core.Command
		for _, cmd := range cmds {
			switch c := cmd.(type) {
			case core.SetTimer:
				w.timer = c.At
			case core.Rest:
				fmt.Fprintf(&w.trace, "@%s %s\n", w.now.Sub(epoch), cmd)
				if restAnswer != nil {
					evs = append(evs, restAnswer)
				}
			case core.Claim:
				fmt.Fprintf(&w.trace, "@%s %s\n", w.now.Sub(epoch), cmd)
				looks = append(looks, look{at: w.now, claim: c})
			}
			if core.IsQueue(cmd) {
				txn = append(txn, cmd)
			}
		}
		if len(txn) > 0 {
			evs = append(evs, w.q.Exec(context.Background(), txn)...)
		}
		if len(evs) > 0 {
			continue
		}
		if !w.timer.After(w.now) || w.timer.After(until) {
			w.now = until
			return looks
		}
		w.now = w.timer
		evs = []core.Event{core.Tick{}}
	}
	w.t.Fatalf("the core did not reach %s", until.Sub(epoch))
	return nil
}

// wantLooksEvery fails the test unless the core looked at least every
// pause from from to the last look.
func wantLooksEvery(t *testing.T, looks []look, from time.Time, pause time.Duration) {
	t.Helper()
	if len(looks) == 0 {
		t.Fatalf("the core never looked")
	}
	last := from
	for _, l := range looks {
		if l.at.Sub(last) > pause {
			t.Errorf("the core did not look from %s to %s into the wait (%s), want a look at least every %s",
				last.Sub(from), l.at.Sub(from), l.at.Sub(last), pause)
			return
		}
		last = l.at
	}
}

// firstAfter is the first look at or after t (zero if none).
func firstAfter(looks []look, t time.Time) time.Time {
	for _, l := range looks {
		if !l.at.Before(t) {
			return l.at
		}
	}
	return time.Time{}
}
