package sim

import (
	"container/heap"
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/sim/fakequeue"
)

// epoch is the simulated clock's zero; traces show offsets from it.
var epoch = time.Date(2030, time.January, 1, 0, 0, 0, 0, time.UTC)

// Bounds of the driver (STYLE.md: every loop has a stated limit).
const (
	// stepsPerInstantMax: the core must settle at an instant (stop asking for a
	// Tick now) within this many steps.
	stepsPerInstantMax = 1000
	// stepsMax bounds a whole run; a scenario needs a few thousand.
	stepsMax = 2_000_000
	// tailDefault is how many trace lines a failure shows.
	tailDefault = 150
)

// Options control what a run records; they never change what happens.
type Options struct {
	// Trace, if set, receives every trace line as it is made.
	Trace io.Writer
	// Tail is how many trace lines a Failure keeps (default 150).
	Tail int
	// LateOutlivesDoubt plays a shell that breaks the rule of
	// docs/durability.md for a transaction in doubt: a late transaction may
	// commit after transactions sent after it. Only for the test that shows the
	// checker catches such a shell.
	LateOutlivesDoubt bool
}

// Result is what one run did.
type Result struct {
	Seed     uint64
	Steps    int           // core.Step calls
	SimTime  time.Duration // simulated time from start to the final check
	Messages int           // messages inserted
	Passes   int64         // stage passes, whatever their outcome (fused included)
	Lives    int           // dispatcher lives (restarts + 1)
	// TraceHash is a hash of the whole trace: equal seeds give equal hashes.
	TraceHash uint64
	// Failure is nil when every invariant held and the run converged.
	Failure *Failure
}

// Failure is a broken invariant, with what is needed to replay it.
type Failure struct {
	Seed uint64
	Step int
	At   time.Duration // simulated time
	Rule string        // the name of the rule it broke (sim/rules.go)
	Msg  string        // "rule NAME: what happened"
	Tail []string      // the last trace lines before the failure
}

func (f *Failure) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "simulation failed at step %d, %s: %s\n", f.Step, f.At, f.Msg)
	if f.Seed != 0 {
		fmt.Fprintf(&b, "seed %d; replay: go run ./tools/pepsi-sim -seed %d -v\n", f.Seed, f.Seed)
	} else {
		b.WriteString("scenario drawn by rapid: replay with the -rapid.seed (or -rapid.failfile) rapid prints\n")
	}
	b.WriteString("trace tail:\n")
	for _, l := range f.Tail {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}

// action is something the world does at an instant. life ties it to one core
// life: when that core is gone (crashed or exited) the action is dropped; life 0
// belongs to the world itself (arrivals, faults, restarts).
type action struct {
	at   time.Time
	seq  uint64
	life int
	fn   func()
}

type actionHeap []*action

func (h actionHeap) Len() int { return len(h) }
func (h actionHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h actionHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *actionHeap) Push(x any)   { *h = append(*h, x.(*action)) }
func (h *actionHeap) Pop() any {
	old := *h
	a := old[len(old)-1]
	*h = old[:len(old)-1]
	return a
}

// txn is a queue transaction the world is executing for the core.
type txn struct {
	cmds    []core.Command
	life    int
	sent    time.Time
	applied bool
	// beside: the items of the transactions applied after this one was sent
	// and before it was: rows that a claim of this one may pass over below
	// its floors (the core lowers them when those resolves report them).
	beside []int64
}

type world struct {
	sc  *Scenario
	cfg *conf.Config
	opt Options
	q   *fakequeue.Queue

	now  time.Time
	seq  uint64
	acts actionHeap

	// Each fake draws from its own stream, so a change in one (say, one more
	// transaction) does not reshuffle the others.
	rTxn, rNotify, rProc, rCrash *rand.Rand
	// rFault draws for the fault kinds added after the others (late starts,
	// babbling workers, late transactions), so older seeds' other draws are unchanged.
	rFault *rand.Rand
	// rVacuum draws for inspections and vacuums.
	rVacuum *rand.Rand
	// rGate draws the producers' transaction lengths and the gate's timing and
	// faults (core.Rest, core.Busy).
	rGate *rand.Rand
	// rWrite draws which answered transitions a stage also writes itself, and
	// whether that commit is still on its way when the answer is resolved.
	rWrite *rand.Rand
	// rHold draws which producers hold their transaction open long after
	// their insert (a bulk import), so a Rest waits for them for seconds.
	rHold *rand.Rand
	// rKey draws how much longer a keyed message's producer holds its
	// transaction (faults.keyHold).
	rKey *rand.Rand
	// rOrder draws the order of answers that reach the dispatcher at one
	// instant (Scenario.shuffle).
	rOrder *rand.Rand

	// The gate: the advisory lock the dispatcher takes exclusively to wait for
	// notifications, and producers take shared when they do not notify (schema
	// 4's trigger). gateWant: a Rest asked for it and waits for the sharers;
	// gateGen numbers grants, so a connection loss drawn for one grant does not
	// strike a later one. quiet: the insert in progress sends no NOTIFY.
	gateHeld, gateWant bool
	gateGen            int
	sharers            int
	quiet              bool

	down     []window // database unreachable (outages and crashes), absolute offsets
	healing  bool
	healAt   time.Time
	deadline time.Time // every message must be final by then
	settle   time.Time // quiescent: the final check happens then

	// The dispatcher of the current life.
	life     int
	c        *core.Core
	running  bool
	pending  []core.Event
	timerGen int
	// txns: the queue transactions the world is executing, in the order sent.
	txns []*txn
	// lates: transactions whose reply was lost and which have not committed
	// yet; each commits, or is rolled back, before the next one is sent
	// (endLate).
	lates    []*txn
	lateExec bool // the late transaction is being applied
	carry    []core.Flush
	procs    map[core.WorkerID]*proc
	pids     int

	// The messages: plan index and tries per row id, at w.slot(id) (ids
	// are idBase+1 on: the scenario's queue handed out idBase ids before).
	idBase     int64
	msgOf      []int
	insertedAt []time.Time
	tries      [][]int
	wrote      []bool // the current or last try of the row committed a transition
	inserted   int
	// plannedPages and plannedRows are the queue's size (pages) and live
	// rows (liveRows) when its statistics were last taken, by a vacuum or an
	// analyze.
	plannedPages, plannedRows int64
	// The passes that emitted messages, by passKey; the last of each
	// message; and, while a transaction runs, the pass each of its resolve
	// items writes (emit.go).
	passes     map[string]*emitPass
	childrenIn int // the rows the fake queue inserted as children
	lastPass   map[int64]string
	resolving  map[int64]string

	model

	tr          tracer
	steps       int
	instant     time.Time
	instantRuns int
	steppedAt   time.Time // the instant of the last step
	fail        *Failure
}

// Run plays one scenario to the end and checks it.
func Run(sc *Scenario, opt Options) (res Result) {
	w := newWorld(sc, opt)
	defer func() {
		if p := recover(); p != nil {
			w.broke(ruleWorldConsistent, "panic: %v\n%s", p, debug.Stack())
		}
		res = w.result()
	}()
	w.run()
	return res
}

func newWorld(sc *Scenario, opt Options) *world {
	cfg, err := conf.Parse("sim.conf", sc.Conf())
	if err != nil {
		panic(fmt.Sprintf("sim: scenario configuration does not parse: %v", err))
	}
	if opt.Tail <= 0 {
		opt.Tail = tailDefault
	}
	w := &world{
		sc: sc, cfg: cfg, opt: opt, q: fakequeue.New(), now: epoch,
		rTxn:    rand.New(rand.NewPCG(sc.WorldSeed, 1)),
		rNotify: rand.New(rand.NewPCG(sc.WorldSeed, 2)),
		rProc:   rand.New(rand.NewPCG(sc.WorldSeed, 3)),
		rCrash:  rand.New(rand.NewPCG(sc.WorldSeed, 4)),
		rFault:  rand.New(rand.NewPCG(sc.WorldSeed, 5)),
		rVacuum: rand.New(rand.NewPCG(sc.WorldSeed, 6)),
		rGate:   rand.New(rand.NewPCG(sc.WorldSeed, 7)),
		rWrite:  rand.New(rand.NewPCG(sc.WorldSeed, 8)),
		rHold:   rand.New(rand.NewPCG(sc.WorldSeed, 20)),
		rKey:    rand.New(rand.NewPCG(sc.WorldSeed, 21)),
		rOrder:  rand.New(rand.NewPCG(sc.WorldSeed, 9)),
	}
	w.idBase = sc.idBase
	w.q.StartAfter(sc.idBase)
	w.q.RefuseStateKey(refusedKey) // (kRefused answers add it; nothing else does)
	w.retried = map[int64]time.Time{}
	w.strayed = map[int64]int{}
	w.tr = tracer{w: opt.Trace, ring: make([]string, opt.Tail), h: fnv.New64a()}
	w.down = append(append([]window{}, sc.faults.outages...), sc.faults.pgCrashes...)
	w.q.Notify = w.notified
	w.q.Clock = func() time.Time { return w.now }
	w.q.Observe = func(c fakequeue.Change) {
		w.observe(c)
		w.watchLongPause(c)
		w.observeResolved(c)
	}
	w.q.Inserted = w.childInserted
	return w
}

func (w *world) result() Result {
	r := Result{Seed: w.sc.Seed, Steps: w.steps, SimTime: w.now.Sub(epoch), Messages: w.inserted,
		Lives: w.life, TraceHash: w.tr.h.Sum64(), Failure: w.fail}
	for _, t := range w.truths {
		r.Passes += t.passes
	}
	return r
}

// at schedules fn at instant t (never in the past) for the given life.
func (w *world) at(t time.Time, life int, fn func()) {
	if t.Before(w.now) {
		t = w.now
	}
	w.seq++
	heap.Push(&w.acts, &action{at: t, seq: w.seq, life: life, fn: fn})
}

// after schedules fn d from now for the current life.
func (w *world) after(d time.Duration, fn func()) { w.at(w.now.Add(d), w.life, fn) }

func (w *world) failf(format string, args ...any) {
	if w.fail != nil {
		return
	}
	msg := fmt.Sprintf(format, args...)
	w.tr.line("!! " + msg)
	w.fail = &Failure{Seed: w.sc.Seed, Step: w.steps, At: w.now.Sub(epoch), Msg: msg, Tail: w.tr.tail()}
}

func (w *world) note(format string, args ...any) {
	w.tr.line("  ~ " + fmt.Sprintf(format, args...))
}

func (w *world) offset() time.Duration { return w.now.Sub(epoch) }

// run schedules the scenario and drives it until the final check or a failure.
func (w *world) run() {
	for _, l := range strings.Split(strings.TrimSuffix(w.sc.String(), "\n"), "\n") {
		w.tr.line(l)
	}
	w.schedule()
	w.startLife()

	for w.fail == nil {
		if len(w.pending) > 0 {
			w.step()
			continue
		}
		if w.finished() {
			return
		}
		if w.acts.Len() == 0 {
			w.broke(ruleWorldConsistent, "the world stopped: nothing is scheduled and the core asked for no timer")
			return
		}
		a := heap.Pop(&w.acts).(*action)
		if a.at.After(w.now) {
			w.now = a.at
			w.checkTimely()
			if w.fail != nil {
				return
			}
		}
		w.do(a)
		for w.acts.Len() > 0 && !w.acts[0].at.After(w.now) {
			w.do(heap.Pop(&w.acts).(*action))
		}
	}
}

// schedule puts the scenario's arrivals and faults, the heal and the
// deadline on the world's clock.
func (w *world) schedule() {
	sc := w.sc
	for i, m := range sc.messages[:sc.produced] {
		if m.at == 0 {
			w.insert(i)
		} else {
			w.at(epoch.Add(m.at), 0, func() { w.insert(i) })
		}
	}
	for _, win := range sc.faults.outages {
		w.at(epoch.Add(win.from), 0, func() { w.note("the database becomes unreachable until %s", win.to) })
	}
	for _, win := range w.down {
		w.at(epoch.Add(win.to), 0, w.databaseBack)
	}
	for _, win := range sc.faults.pgCrashes {
		w.at(epoch.Add(win.from), 0, func() {
			w.note("PostgreSQL crashes: stage writes since the last dispatcher commit are lost; down until %s", win.to)
			if len(w.lates) > 0 {
				w.note("the transaction whose reply was lost dies with the server")
				w.lates = nil
			}
			w.q.Crash()
		})
	}
	for _, at := range sc.faults.crashes {
		w.at(epoch.Add(at), 0, w.crashDispatcher)
	}
	for _, s := range sc.faults.shutdowns {
		w.at(epoch.Add(s.at), 0, func() { w.signal(s.again) })
	}
	for _, at := range sc.faults.lockLosses {
		w.at(epoch.Add(at), 0, w.loseLock)
	}
	for _, at := range sc.faults.retries {
		w.at(epoch.Add(at), 0, func() { w.operatorRetry(false) })
	}
	for _, at := range sc.faults.strays {
		w.at(epoch.Add(at), 0, w.stray)
	}
	for _, at := range sc.faults.rawRetries {
		w.at(epoch.Add(at), 0, w.rawRetry)
	}
	if every := sc.faults.keyRetryEvery; every > 0 {
		for at := every; at < sc.faultPhase; at += every {
			w.at(epoch.Add(at), 0, w.keyRetry)
		}
	}
	if f := sc.faults; f.retryEvery > 0 {
		for at := f.retryLoop.from; at < f.retryLoop.to; at += f.retryEvery {
			w.at(epoch.Add(at), 0, func() { w.operatorRetry(true) })
		}
	}
	w.healAt = epoch.Add(sc.faultPhase)
	w.deadline = w.healAt.Add(w.healBound())
	w.at(w.healAt, 0, w.heal)
	w.at(w.deadline, 0, func() {})
}

func (w *world) do(a *action) {
	if a.life != 0 && (!w.running || a.life != w.life) {
		return // belongs to a core that is gone
	}
	a.fn()
}

// healBound is how long the healing phase may take to bring every message to a
// final status: hung workers, stop grace, the longest cooldown and pause, polls
// and restarts, plus every remaining good pass run one at a time.
func (w *world) healBound() time.Duration {
	sc := w.sc
	work := time.Duration(0)
	for _, m := range sc.messages {
		for _, v := range m.visits {
			work += v.latency + 100*time.Millisecond
			// Each pass that commits may emit messages, each a pass of its own.
			work += time.Duration(v.emits*(1+len(v.trouble))) * 150 * time.Millisecond
		}
	}
	// A message may wait out its longest retry delay (and its jitter) after the
	// faults end, and a stage with a RATE takes its visits no faster than that.
	for s, st := range w.cfg.Stages {
		if st.RetryLimit > 0 {
			work += st.RetryDelayMax + time.Duration(float64(st.RetryDelayMax)*core.RetryJitter)
		}
		if st.Rate > 0 {
			visits := 0
			for _, m := range sc.messages {
				if m.first <= s && s <= m.last {
					visits++
				}
			}
			work += time.Duration(float64(visits+1) / st.Rate * float64(time.Second))
		}
	}
	return 3*sc.longestRuntime() + 2*sc.grace + 2*core.CooldownMax + 3*sc.poll + time.Minute + sc.stats + 2*sc.restart + 30*time.Second + work
}

// heal ends the fault phase: from now on every fault is off.
func (w *world) heal() {
	w.healing = true
	w.note("healing: every fault is off from now on")
}

// finished runs the end-of-run checks once the world is quiescent after healing,
// or fails the run when the deadline has passed.
func (w *world) finished() bool {
	if !w.healing {
		return false
	}
	if w.settle.IsZero() {
		if w.quiescent() {
			w.settle = w.now.Add(w.sc.stats + w.sc.idle + w.sc.grace + 2*core.IdleFlushMin)
			w.note("quiescent: every message is final; final check at %s", w.settle.Sub(epoch))
			w.at(w.settle, 0, func() {})
			return false
		}
		if !w.now.Before(w.deadline) {
			w.checkAt(atEnd, crossing{overdue: true}) // rule liveness breaks
			return true
		}
		return false
	}
	if w.now.Before(w.settle) {
		return false
	}
	w.finalCheck()
	return true
}

// quiescent: every message is inserted and final, the core holds nothing and no
// queue transaction is outstanding.
func (w *world) quiescent() bool {
	if !w.running || w.inserted < w.sc.produced || len(w.txns) > 0 || w.txnOut() || !w.nothingHeld() {
		return false
	}
	for _, r := range w.q.Rows() {
		if !r.Status.Final() {
			return false
		}
	}
	return true
}

func (w *world) unfinished() string {
	var parts []string
	for _, r := range w.q.Rows() {
		if !r.Status.Final() {
			s := fmt.Sprintf("%d@%s:%s", r.ID, r.Stage, r.Status)
			if r.Status == core.StatusPaused {
				s += "(until " + r.Timeout.Sub(epoch).String() + ")"
			}
			parts = append(parts, s)
		}
	}
	if w.inserted < w.sc.produced {
		parts = append(parts, fmt.Sprintf("%d not inserted", w.sc.produced-w.inserted))
	}
	if len(parts) == 0 {
		parts = append(parts, "(every row is final, but the core still holds or owes messages: "+w.heldText()+")")
	}
	if len(parts) > 20 {
		parts = append(parts[:20], fmt.Sprintf("… %d more", len(parts)-20))
	}
	return strings.Join(parts, " ")
}

// ---- the database ----

// dbDown reports whether the database is unreachable now.
func (w *world) dbDown() bool {
	if w.healing {
		return false
	}
	off := w.offset()
	for _, win := range w.down {
		if win.from <= off && off < win.to {
			return true
		}
	}
	return false
}

// upAt is when the database is reachable again (now if it is).
func (w *world) upAt() time.Time {
	if w.healing {
		return w.now
	}
	off := w.offset()
	for changed := true; changed; {
		changed = false
		for _, win := range w.down {
			if win.from <= off && off < win.to {
				off, changed = win.to, true
			}
		}
	}
	return epoch.Add(off)
}

// databaseBack runs when an outage window ends: the listener reconnects and the
// shell reports DatabaseUp.
func (w *world) databaseBack() {
	if !w.running || w.dbDown() {
		return
	}
	w.note("database reachable again")
	w.after(w.randDur(w.rTxn, 0, time.Second), w.deliver(core.DatabaseUp{}))
}

func (w *world) randDur(r *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1))
}

func (w *world) chance(r *rand.Rand, perMille int) bool {
	return !w.healing && perMille > 0 && r.IntN(1000) < perMille
}

// deliver returns an action that hands ev to the core at the next step.
func (w *world) deliver(ev core.Event) func() {
	return func() { w.pending = append(w.pending, ev) }
}

// notified is the fake queue's NOTIFY hook: the listener delivers Ingress a moment
// later, unless the notification is lost or the connection is down.
func (w *world) notified() {
	if !w.running || w.quiet {
		return
	}
	if w.chance(w.rNotify, w.sc.faults.lostNotify) {
		w.note("NOTIFY ingress lost")
		return
	}
	w.after(w.randDur(w.rNotify, 100*time.Microsecond, 10*time.Millisecond), func() {
		if w.dbDown() {
			w.note("NOTIFY ingress lost: the listener is disconnected")
			return
		}
		w.pending = append(w.pending, core.Ingress{})
	})
}

// operatorRetry plays pepsi-queue retry: every failed and timed-out row is
// pending again at its stage, and the tool's NOTIFY follows its commit. The
// operator retries what the dispatcher has seen fail; with inFlight, instead
// the rows a stage failed whose answer the dispatcher has not read yet, still
// held by their worker: the dispatcher must not claim one again until that
// answer, nor let the answer judge its next pass (docs/operations.md,
// "Retrying").
func (w *world) operatorRetry(inFlight bool) {
	if w.dbDown() {
		w.note("an operator's retry fails: the database is unreachable")
		return
	}
	ids := w.q.RetryAll(func(id int64) bool {
		_, heldByWorker := w.holder[id]
		_, held := w.heldBy(id)
		if inFlight {
			return !heldByWorker
		}
		return held
	})
	if len(ids) > 0 {
		w.note("an operator retries %d failed messages: rows %v", len(ids), ids)
	}
	for _, id := range ids {
		w.retried[id] = time.Time{}
		// A failure whose reply was lost, retried before the re-sent resolve
		// reports it: the core can never learn of it, so it is not counted.
		delete(w.verdicts, id)
	}
}

// rawRetry plays an operator's own SQL that makes the failed keyed messages
// the dispatcher has seen fail pending again, with a NOTIFY, but without the
// release of their keys (fakequeue.RawRetry).
func (w *world) rawRetry() {
	if w.dbDown() {
		return
	}
	ids := w.q.RawRetry(func(id int64) bool { _, held := w.heldBy(id); return held })
	if len(ids) > 0 {
		w.note("an operator's own SQL makes failed keyed rows %v pending, without their keys' release", ids)
	}
	for _, id := range ids {
		w.retried[id] = time.Time{}
		delete(w.verdicts, id)
	}
}

// stray plays a mistaken tool that makes a pending row running behind the
// dispatcher's back (fakequeue.Stray). Not a row the dispatcher holds (one a
// stage failed and an operator retried while its worker still has it): that
// row running at its stage when the worker answers a bare 0 is what a stage
// bug looks like, and no dispatcher could tell the two apart.
func (w *world) stray() {
	if w.dbDown() {
		return
	}
	id := w.q.Stray(func(id int64) bool {
		_, heldByWorker := w.holder[id]
		_, held := w.heldBy(id)
		return heldByWorker || held
	})
	if id != 0 {
		w.note("a mistaken tool makes row %d running", id)
	}
}

// longPause is a pause no scenario waits out: the operator ends it by hand.
const longPause = 24 * time.Hour

// watchLongPause: a row paused for longer than longPause (a stage answered or
// wrote paused:315360000, the largest allowed) is made pending again by an
// operator a second later, so the run can end.
func (w *world) watchLongPause(c fakequeue.Change) {
	if c.After.Status == core.StatusPaused && c.After.Timeout.Sub(w.now) > longPause {
		id, until := c.After.ID, c.After.Timeout
		w.at(w.now.Add(time.Second), 0, func() { w.unpause(id, until) })
	}
}

// unpause is the operator's SQL for row id, paused until until: it waits
// while the database is down or the dispatcher still holds the row (its
// answer not yet read), and does nothing once someone else moved the row.
func (w *world) unpause(id int64, until time.Time) {
	if r, _ := w.q.Get(id); r.Status != core.StatusPaused || !r.Timeout.Equal(until) {
		return
	}
	if _, held := w.heldBy(id); held || w.dbDown() {
		w.at(w.now.Add(time.Second), 0, func() { w.unpause(id, until) })
		return
	}
	w.note("an operator ends the pause of row %d until %s by hand (pending, NOTIFY ingress)", id, until.Sub(epoch))
	w.q.Unpause(id)
	w.retried[id] = time.Time{}
}

// insert starts the producer transaction of message i, as the ingress side does
// (it waits for the database when it is down). Its INSERT fires the trigger now:
// while the gate is held or asked for, the producer will notify; otherwise it
// holds the gate shared until it commits, a moment (or a long while) later.
func (w *world) insert(i int) {
	if w.dbDown() {
		w.at(w.upAt(), 0, func() { w.insert(i) })
		return
	}
	// While the gate is free the trigger holds it shared until commit, and
	// does not notify.
	shared := !w.gateHeld && !w.gateWant
	if shared {
		w.sharers++
	}
	// The row's id is taken now, at the INSERT; the row appears at commit. A
	// producer that commits later than one that inserted after it leaves a row
	// behind ids a claim has already seen (Claimed.Settled is the core's guard).
	// A keyed row takes its key's lock first, and waits while another
	// producer of its key holds it.
	var id int64
	if key := w.sc.messages[i].key; key != "" {
		var ok bool
		if id, ok = w.q.ReserveKeyed(key); !ok {
			if shared {
				w.unshare()
			}
			w.at(w.now.Add(time.Millisecond), 0, func() { w.insert(i) })
			return
		}
	} else {
		id = w.q.Reserve()
	}
	w.msgOf = append(w.msgOf, i)
	w.insertedAt = append(w.insertedAt, time.Time{})
	w.tries = append(w.tries, make([]int, len(w.sc.stages)))
	w.wrote = append(w.wrote, false)
	w.claimGen = append(w.claimGen, 0)
	var d time.Duration
	switch r := w.rGate.IntN(10); {
	case r < 3:
	case r < 9:
		d = w.randDur(w.rGate, 0, 5*time.Millisecond)
	default:
		d = w.randDur(w.rGate, 5*time.Millisecond, 100*time.Millisecond)
	}
	if w.rHold.IntN(longHoldOdds) == 0 {
		d = w.randDur(w.rHold, 100*time.Millisecond, 5*time.Second)
	}
	if w.sc.messages[i].key != "" && w.sc.faults.keyHold > 0 {
		d += w.randDur(w.rKey, 0, w.sc.faults.keyHold)
	}
	// A scheduled message inserted paused notifies whatever the gate says
	// (its not_before is a pause the dispatcher cannot otherwise know of);
	// one blocked behind its key does not (its key's release reports it).
	notify := !shared || (w.sc.messages[i].notBefore > 0 && !w.q.ReservedBlocked(id))
	w.at(w.now.Add(d), 0, func() { w.commitInsert(i, id, shared, notify) })
}

// slot is row id's index in the world's per-row slices (msgOf, insertedAt,
// tries, wrote, claimGen).
func (w *world) slot(id int64) int { return int(id - w.idBase - 1) }

// longHoldOdds: one producer transaction in this many stays open 0.1–5 s
// after its insert. While the core is busy when it inserts, it holds the gate
// shared all that time, so the core's next Rest waits that long, and the rows
// other producers commit meanwhile notify no one (rule no-wait-for-heartbeat).
const longHoldOdds = 40

// payloadOf is message i's payload: NULL, text, or bytes that are not UTF-8,
// so the lines of INPUT = message stages carry each form.
func payloadOf(i int) []byte {
	switch i % 3 {
	case 0:
		return nil
	case 1:
		return []byte(fmt.Sprintf("message %d: \"quoted\" é", i))
	}
	return []byte{0xff, byte(i), 0}
}

// commitInsert commits message i's producer transaction, which holds row id:
// the row becomes visible, the NOTIFY (if the trigger sent one) is delivered,
// and the shared hold on the gate ends. With the database down the transaction
// is lost, its id unused, and the producer tries again.
func (w *world) commitInsert(i int, id int64, shared, notify bool) {
	if shared {
		w.unshare()
	}
	m := w.sc.messages[i]
	if w.dbDown() {
		w.q.Abort(id)
		w.msgOf[w.slot(id)] = -1
		w.at(w.upAt(), 0, func() { w.insert(i) })
		return
	}
	var notBefore time.Time
	if m.notBefore > 0 {
		notBefore = w.now.Add(m.notBefore)
	}
	w.quiet = !notify
	w.q.CommitMessage(id, w.sc.stages[m.first].name, payloadOf(i), notBefore)
	w.quiet = false
	w.inserted++
	w.insertedAt[w.slot(id)] = w.now
	if r, _ := w.q.Get(id); r.Status == core.StatusPaused && w.running {
		w.unseen[id] = true
	}
	if !notBefore.IsZero() {
		w.note("ingress inserts message %d as row %d at %s, scheduled: paused until %s (NOTIFY ingress)", i, id, w.sc.stages[m.first].name, notBefore.Sub(epoch))
		return
	}
	if notify {
		w.note("ingress inserts message %d as row %d at %s", i, id, w.sc.stages[m.first].name)
		return
	}
	w.note("ingress inserts message %d as row %d at %s without NOTIFY (the dispatcher looked busy)", i, id, w.sc.stages[m.first].name)
	if w.running {
		w.unnotified[id] = unnotified{committed: w.now, since: w.now}
	}
}

// unshare ends a producer's shared hold on the gate; the last one lets a Rest
// waiting for it through.
func (w *world) unshare() {
	w.sharers--
	if w.sharers == 0 && w.gateWant {
		w.grant()
	}
}

// rest executes core.Rest: the request reaches the server a moment later and
// waits there for every producer holding the gate shared.
func (w *world) rest() {
	w.after(w.randDur(w.rGate, 100*time.Microsecond, 2*time.Millisecond), func() {
		if w.dbDown() || w.chance(w.rGate, w.sc.faults.gateFail) {
			w.note("the gate cannot be taken")
			w.after(w.randDur(w.rGate, 0, 2*time.Millisecond), w.deliver(core.Resting{Err: "gate: connection refused"}))
			return
		}
		w.gateWant = true
		if w.sharers == 0 {
			w.grant()
			return
		}
		w.note("the rest waits for %d producers holding the gate", w.sharers)
	})
}

// grant gives the gate to the current dispatcher and answers its Rest.
func (w *world) grant() {
	w.gateWant, w.gateHeld = false, true
	w.gateGen++
	gen := w.gateGen
	w.note("the dispatcher holds the gate: producers notify")
	w.after(w.randDur(w.rGate, 0, 2*time.Millisecond), w.deliver(core.Resting{}))
	if w.chance(w.rGate, w.sc.faults.gateLoss) {
		w.after(w.randDur(w.rGate, time.Millisecond, 5*time.Second), func() {
			if !w.gateHeld || gen != w.gateGen || w.healing {
				return
			}
			w.gateHeld = false
			w.note("the gate's connection dies: producers stop notifying")
			w.after(w.randDur(w.rGate, 0, 100*time.Millisecond), w.deliver(core.RestLost{}))
		})
	}
}

// ---- the dispatcher's lives ----

func (w *world) startLife() {
	if w.running {
		return
	}
	w.life++
	w.c = core.New(w.cfg)
	w.running = true
	w.timerGen++
	w.txns = nil
	w.procs = map[core.WorkerID]*proc{}
	w.startCarry = w.carry
	w.carry = nil
	w.newLifeModel()
	w.note("dispatcher starts (life %d)", w.life)
	// Each life's jitter replays from the scenario's seed.
	w.pending = append(w.pending, core.Start{Carry: w.startCarry, Seed: w.sc.WorldSeed + uint64(w.life), Life: int64(w.life)})
}

// endLife forgets the current core: its workers die with it, and a transaction
// it had in flight either committed or did not.
func (w *world) endLife(why string, exact bool, restart time.Duration) {
	for _, t := range w.txns {
		if !t.applied && w.rCrash.IntN(2) == 0 {
			w.note("its transaction op=%d in flight commits anyway", core.QueueOp(t.cmds[0]))
			w.exec(t)
		}
	}
	w.txns = nil
	// The gate's connection dies with the process, and the lock with it.
	w.gateHeld, w.gateWant = false, false
	for _, id := range sortedKeys(w.procs) {
		w.vanish(w.procs[id])
	}
	w.endLifeModel(exact)
	w.running = false
	w.pending = nil
	w.note("dispatcher gone (%s); restart in %s", why, restart)
	w.at(w.now.Add(restart), 0, w.startLife)
}

// loseLock models the shell losing the single-dispatcher lock (its lock
// connection broke): it kills its workers, lets its transaction in flight end
// either way, and starts a new core at once (after the time it takes to take
// the lock again), handing it the old core's unflushed statistics.
func (w *world) loseLock() {
	if !w.running {
		return
	}
	w.note("the dispatcher loses its lock")
	w.endLate()
	carry := w.c.Unflushed()
	w.endLife("lost its lock", true, w.randDur(w.rFault, time.Millisecond, 500*time.Millisecond))
	w.carry = carry
}

func (w *world) crashDispatcher() {
	if !w.running {
		return
	}
	w.note("the dispatcher process crashes")
	w.endLife("crashed", false, w.sc.restart)
}

// signal delivers SIGTERM, and a second one again later if again > 0.
func (w *world) signal(again time.Duration) {
	if !w.running || w.shut > 0 {
		return
	}
	w.pending = append(w.pending, core.Shutdown{})
	if again > 0 {
		w.after(again, func() {
			if !w.healing { // a fault: it must not strike after healing began
				w.pending = append(w.pending, core.Shutdown{})
			}
		})
	}
}

// ---- stepping the core ----

// arrivals reorders, in place, each run of consecutive answers in evs that
// reach the dispatcher at one instant: their workers interleave in an order
// drawn from rOrder, each worker's own answers kept in the order it wrote them
// (as the shell, reading several pipes, may see them). Nothing else moves, so
// no answer passes its worker's exit.
func (w *world) arrivals(evs []core.Event) {
	for from := 0; from < len(evs); {
		to := from
		for to < len(evs) {
			if _, ok := evs[to].(core.Answer); !ok {
				break
			}
			to++
		}
		if to-from > 1 {
			w.interleave(evs[from:to])
		}
		from = to + 1
	}
}

// interleave draws an order of run, a run of answers, that keeps each
// worker's answers in their order.
func (w *world) interleave(run []core.Event) {
	var order []core.WorkerID
	byWorker := map[core.WorkerID][]core.Event{}
	for _, ev := range run {
		a := ev.(core.Answer)
		if len(byWorker[a.Worker]) == 0 {
			order = append(order, a.Worker)
		}
		byWorker[a.Worker] = append(byWorker[a.Worker], ev)
	}
	for i := range run {
		k := w.rOrder.IntN(len(order))
		id := order[k]
		run[i], byWorker[id] = byWorker[id][0], byWorker[id][1:]
		if len(byWorker[id]) == 0 {
			order = append(order[:k], order[k+1:]...)
		}
	}
}

func (w *world) step() {
	evs := w.pending
	w.pending = nil
	if w.sc.shuffle {
		w.arrivals(evs)
	}
	w.steps++
	if w.steps > stepsMax {
		w.broke(ruleWorldConsistent, "the run exceeded %d steps", stepsMax)
		return
	}
	if w.now.Equal(w.instant) {
		w.instantRuns++
		if w.instantRuns > stepsPerInstantMax {
			w.broke(ruleWorldConsistent, "the core does not settle: %d steps at one instant", w.instantRuns)
			return
		}
	} else {
		w.instant, w.instantRuns = w.now, 0
	}
	var b strings.Builder
	fmt.Fprintf(&b, "@%s L%d", w.offset(), w.life)
	for i, ev := range evs {
		if i > 0 {
			b.WriteString(" |")
		}
		b.WriteByte(' ')
		b.WriteString(ev.String())
	}
	w.tr.line(b.String())
	if w.shut == 0 && !w.now.Before(w.lastPoll.Add(w.sc.poll)) {
		// The heartbeat: the core looks for work at every stage.
		w.lastPoll = w.now
		w.tellAll()
		w.wakeComing()
	}
	for _, ev := range evs {
		w.modelEvent(ev)
	}
	free := !w.txnOut()
	cmds := w.c.Step(w.now, evs...)
	for _, cmd := range cmds {
		w.tr.line("  " + cmd.String())
	}
	w.modelCommands(cmds)
	if w.fail != nil || !w.execute(cmds) {
		return
	}
	w.checkStep(free)
	w.steppedAt = w.now
}

// execute runs the commands of a step in the fake world, the queue's in one
// transaction. It reports false when the core exited or the run failed.
func (w *world) execute(cmds []core.Command) bool {
	var tx []core.Command
	for _, cmd := range cmds {
		switch x := cmd.(type) {
		case core.Spawn:
			w.spawn(x)
		case core.CheckProgram:
			// The world's programs can all be run: a start fails, when it
			// does, as the scenario drew it.
			w.pending = append(w.pending, core.ProgramChecked{Stage: x.Stage})
		case core.Write:
			w.write(x)
		case core.Stop:
			w.stop(x)
		case core.Kill:
			w.kill(x)
		case core.SetTimer:
			w.setTimer(x)
		case core.Inspect:
			w.inspect(x)
		case core.Vacuum:
			w.vacuum(x)
		case core.Exit:
			w.endLife(fmt.Sprintf("exit %d", x.Code), x.Code == 0, w.sc.restart)
			return false
		case core.Rest:
			w.rest()
		case core.Busy:
			w.gateHeld = false
		case core.Log:
		default:
			if !core.IsQueue(cmd) {
				w.broke(ruleWorldConsistent, "unknown command %T", cmd)
				return false
			}
			tx = append(tx, cmd)
		}
	}
	if len(tx) > 0 {
		w.send(tx)
	}
	return true
}

func (w *world) setTimer(x core.SetTimer) {
	w.timerGen++
	if x.At.IsZero() {
		return
	}
	gen := w.timerGen
	w.at(x.At, w.life, func() {
		if gen == w.timerGen {
			w.pending = append(w.pending, core.Tick{})
		}
	})
}

// txnFault is what the fake world does to one queue transaction.
type txnFault int

// The transaction faults; the text of each is what the trace says.
const (
	txnOK          txnFault = iota
	txnFailsBefore          // fails before it takes effect
	txnLosesReply           // takes effect, but its reply is lost
	txnRetried              // hits 40001 and is retried by the shell (slower)
	txnCommitsLate          // loses its reply and commits later, before the next is sent
)

func (f txnFault) String() string {
	return [...]string{"", "fails before it takes effect", "takes effect, but its reply is lost",
		"hits 40001 and is retried by the shell", "loses its reply and commits later"}[f]
}

// send executes a queue transaction: it takes effect a moment later (or not, or
// loses its reply), and its results come back a moment after that.
func (w *world) send(cmds []core.Command) {
	if !w.opt.LateOutlivesDoubt {
		w.endLate()
	}
	t := &txn{cmds: cmds, life: w.life, sent: w.now}
	w.txns = append(w.txns, t)
	f := w.sc.faults
	fault := txnOK
	switch r := w.rTxn.IntN(1000); {
	case w.healing:
	case r < f.failBefore:
		fault = txnFailsBefore
	case r < f.failBefore+f.failAfter:
		fault = txnLosesReply
	case r < f.failBefore+f.failAfter+f.transient:
		fault = txnRetried
	}
	lat := w.randDur(w.rTxn, 200*time.Microsecond, 20*time.Millisecond)
	if fault == txnRetried {
		lat += w.randDur(w.rTxn, 5*time.Millisecond, 200*time.Millisecond)
	}
	if fault == txnOK && w.chance(w.rFault, f.lateTxn) {
		fault = txnCommitsLate
	}
	w.after(lat, func() {
		var res []core.Event
		switch {
		case fault == txnCommitsLate:
			// The shell gave up on it (a timeout, a broken connection) while the
			// server still runs it: it commits after the core has moved on.
			w.note("transaction op=%d %s", core.QueueOp(cmds[0]), fault)
			res = fakequeue.Failed(cmds, "queue transaction timed out")
			w.lates = append(w.lates, t)
			w.at(w.now.Add(w.randDur(w.rFault, time.Millisecond, 3*time.Second)), 0, func() { w.commitLate(t) })
		case w.dbDown():
			// Never sent (no connection): the shell knows it did not commit.
			w.note("transaction op=%d fails: the database is unreachable", core.QueueOp(cmds[0]))
			res = fakequeue.Aborted(cmds, "dial tcp 127.0.0.1:5432: connect: connection refused")
		case fault == txnFailsBefore && core.QueueOp(cmds[0])%2 == 0:
			// The session was ended before the COMMIT ran, and the shell heard
			// the server say so (an error answered to a statement before it).
			// Half the time (by op, so that no random stream shifts).
			w.note("transaction op=%d %s, aborted", core.QueueOp(cmds[0]), fault)
			res = fakequeue.Aborted(cmds, "FATAL: terminating connection due to administrator command (SQLSTATE 57P01)")
		case fault == txnFailsBefore:
			w.note("transaction op=%d %s", core.QueueOp(cmds[0]), fault)
			res = fakequeue.Failed(cmds, "server closed the connection unexpectedly")
		default:
			res = w.exec(t)
			if fault != txnOK {
				w.note("transaction op=%d %s", core.QueueOp(cmds[0]), fault)
			}
			if fault == txnLosesReply {
				res = fakequeue.Failed(cmds, "connection reset by peer during COMMIT")
			}
		}
		w.after(w.randDur(w.rTxn, 0, 5*time.Millisecond), func() {
			w.txns = slices.DeleteFunc(w.txns, func(o *txn) bool { return o == t })
			w.pending = append(w.pending, res...)
			if failed(res) {
				// The shell probes the database and reports it back.
				up := w.upAt().Add(w.randDur(w.rTxn, 100*time.Millisecond, 2*time.Second))
				w.at(up, w.life, w.deliver(core.DatabaseUp{}))
			}
		})
	})
}

// endLate plays the shell's rule for a transaction in doubt: its session is
// ended before any later transaction is sent (store's settle and endDoubt;
// a new dispatcher ends an earlier one's sessions), so a late commit lands
// now, or never.
func (w *world) endLate() {
	for _, t := range slices.Clone(w.lates) {
		if w.rFault.IntN(2) == 0 {
			w.commitLate(t)
		} else {
			w.note("the transaction op=%d whose reply was lost is rolled back with its session", core.QueueOp(t.cmds[0]))
		}
	}
	w.lates = nil
}

// commitLate commits late transaction t, if it has not committed yet (a
// dispatcher that crashed may have seen it commit already: endLife; a
// transaction commits once) and is still in doubt (not rolled back).
func (w *world) commitLate(t *txn) {
	if !slices.Contains(w.lates, t) || t.applied {
		return
	}
	w.lates = slices.DeleteFunc(w.lates, func(o *txn) bool { return o == t })
	w.note("the transaction op=%d whose reply was lost commits now", core.QueueOp(t.cmds[0]))
	w.lateExec = true
	w.exec(t)
	w.lateExec = false
}

// inspect answers an Inspect a moment later with the fake queue's dead row
// versions (scaled), and sometimes finds autovacuum at work, which then removes
// them.
func (w *world) inspect(x core.Inspect) {
	w.after(w.randDur(w.rVacuum, time.Millisecond, 50*time.Millisecond), func() {
		if w.dbDown() {
			w.pending = append(w.pending, core.Inspected{Op: x.Op, Err: "dial tcp 127.0.0.1:5432: connect: connection refused"})
			return
		}
		ev := core.Inspected{Op: x.Op, Dead: w.q.Dead * w.sc.deadScale, Live: w.liveRows(), Autovacuum: w.sc.autovacuum,
			Pages: w.pages(), PlannedPages: w.plannedPages, PlannedRows: w.plannedRows, NotOwner: w.sc.notOwner}
		if w.sc.autovacuum && w.rVacuum.IntN(5) == 0 {
			ev.Vacuuming = true
			w.note("autovacuum is vacuuming the queue")
			w.q.Vacuum()
			w.plannedPages, w.plannedRows = w.pages(), w.liveRows()
		}
		w.pending = append(w.pending, ev)
	})
}

// vacuum runs the core's VACUUM: it takes a while (up to 15 s, longer than
// core.VacuumIntervalMin and core.InspectInterval, so an inspection can find it
// still running), then the dead versions are gone (but for an AnalyzeOnly).
// Any of the three takes the statistics: the queue's size and rows then are
// what the plans are made for.
func (w *world) vacuum(x core.Vacuum) {
	w.after(w.randDur(w.rVacuum, 10*time.Millisecond, 15*time.Second), func() {
		if w.dbDown() {
			w.pending = append(w.pending, core.Vacuumed{Op: x.Op, Err: "server closed the connection unexpectedly"})
			return
		}
		if x.Kind != core.AnalyzeOnly {
			w.q.Vacuum()
		}
		w.plannedPages, w.plannedRows = w.pages(), w.liveRows()
		w.pending = append(w.pending, core.Vacuumed{Op: x.Op})
	})
}

// pages is the fake queue's size in pages: its rows, finished ones included,
// scaled as its dead row versions are (a few rows make a queue of hundreds of
// pages, so that scenarios reach core.AnalyzePagesMin).
func (w *world) pages() int64 {
	return w.q.Size() * w.sc.deadScale / 100
}

// liveRows is the inspections' Live: the messages inserted, scaled as the
// dead row versions are (so that scenarios reach core.AnalyzeRowsMin).
func (w *world) liveRows() int64 {
	return int64(w.inserted) * w.sc.deadScale
}

// exec applies a transaction to the fake queue (a dispatcher commit). Before a
// claim of the core's own transaction runs, it checks that the claim's floors
// pass over no pending row (a late claim, of a core that has moved on, is not
// held to it).
func (w *world) exec(t *txn) []core.Event {
	t.applied = true
	for _, o := range w.txns {
		if o != t && !o.applied {
			o.beside = append(o.beside, resolveItems(t.cmds)...)
		}
	}
	w.execLife = t.life
	w.resolvingPasses(t.cmds)
	var res []core.Event
	from := 0
	for i, cmd := range t.cmds {
		if c, ok := cmd.(core.Claim); ok && !w.lateExec {
			res = append(res, w.q.Exec(context.Background(), t.cmds[from:i])...)
			from = i
			run := releasedRun(c, t.sent, t.cmds[:i], res)
			run.beside = t.beside
			w.checkAt(atChange, crossing{claimRun: run})
		}
	}
	return append(res, w.q.Exec(context.Background(), t.cmds[from:])...)
}

// resolveItems lists the ids of the items of cmds' resolves.
func resolveItems(cmds []core.Command) []int64 {
	var ids []int64
	for _, cmd := range cmds {
		if r, ok := cmd.(core.Resolve); ok {
			for _, it := range r.Items {
				ids = append(ids, it.ID)
			}
		}
	}
	return ids
}

func failed(evs []core.Event) bool {
	for _, ev := range evs {
		if core.QueueErr(ev) != "" {
			return true
		}
	}
	return false
}

// ---- the trace ----

// tracer keeps the tail of the trace for failures, hashes all of it, and writes it
// out when asked.
type tracer struct {
	w    io.Writer
	ring []string
	next int
	full bool
	h    interface {
		io.Writer
		Sum64() uint64
	}
}

func (t *tracer) line(s string) {
	t.ring[t.next] = s
	t.next++
	if t.next == len(t.ring) {
		t.next, t.full = 0, true
	}
	_, _ = io.WriteString(t.h, s)
	_, _ = t.h.Write([]byte{'\n'})
	if t.w != nil {
		_, _ = io.WriteString(t.w, s+"\n") // a trace writer's error must not change the run
	}
}

func (t *tracer) tail() []string {
	if !t.full {
		return append([]string(nil), t.ring[:t.next]...)
	}
	return append(append([]string(nil), t.ring[t.next:]...), t.ring[:t.next]...)
}
