// Package core is the pepsi-dispatch state machine: every decision the dispatcher
// takes is taken here, and nothing else happens here.
//
// One way in, one way out: the shell calls
//
//	cmds := c.Step(now, events...)
//
// with every event it has gathered since the last call (answers, exits, results of
// queue commands, notifications, ticks, signals) and the current instant, and then
// executes the returned commands in order. Step applies all the events first, so
// per-stage capacities are current, and only then decides what to claim, assign,
// spawn, stop, kill, requeue, fail, wake and flush, and when it next wants a Tick.
//
// The core must never do I/O, start goroutines, read the clock or keep global
// state: time comes in as the now argument, and the same events at the same
// instants always yield the same commands, which is what lets sim/ test it.
//
// The queue commands of one Step form one transaction. With SESSIONS = 1 (the
// default) queue writes are strictly serial: no new transaction is issued
// until every result of the previous one has come back. With more, up to
// SESSIONS are outstanding, and the core sends beside each other only
// transactions that touch no row in common: beside the step's full
// transaction (which alone resets, claims, wakes, releases keys, flushes and
// keeps the history) go resolves of other items (queueWork). A failed
// transaction may or may not have committed; the core is written so that
// re-sending what it owed is safe either way (see Item, Flush and
// ResetOrphans), and it re-sends only after the shell reports DatabaseUp.
package core

import (
	"fmt"
	"slices"
	"time"

	"github.com/pepsi-pipeline/pepsi/core/conf"
)

// Thresholds that the reference text leaves to us; documented in pepsi-dispatch(1).
const (
	// StartWindow: a worker that exits having answered nothing within this long of
	// its spawn counts as a program that cannot start, not as a crash on a message.
	StartWindow = 5 * time.Second
	// StartFailLimit: a message at the head of this many failed starts in a row is
	// failed, so a message that kills every worker on sight cannot loop forever.
	StartFailLimit = 3
	// CooldownMin and CooldownMax bound the spawn cooldown of a stage whose program
	// cannot start; it doubles with each failed start (once per round of starts,
	// however many of the workers started together fail, and when) and resets on
	// an answer.
	CooldownMin = 1 * time.Second
	CooldownMax = 30 * time.Second
	// IdleFlushMin: a flush on going idle happens at most this often.
	IdleFlushMin = 1 * time.Second
	// startFailsMax bounds the memory of failed starts per message.
	startFailsMax = 10000
	// RestAfter: the core declares itself waiting (Rest) once it has had nothing
	// to claim, nothing to write and no transaction outstanding for this long
	// since its last claim (sent, or answered with work: a claim's rows, or a
	// move that claimed its row at the next stage). Until then producers do not notify, and a row they
	// commit waits at most this long (plus the rest handshake) for the last
	// look; a pipeline that claims more often than this never makes a producer
	// notify.
	RestAfter = 2 * time.Millisecond
	// RestRetryMin and RestRetryMax bound the pause before the core asks for the
	// gate again after it could not be taken (it doubles each time). Meanwhile
	// it looks every LookEvery, so no row waits for the next try.
	RestRetryMin = 10 * time.Millisecond
	RestRetryMax = 1 * time.Second
	// LookEvery is how often the core looks for work by itself while nobody
	// would tell it: while its Rest waits for the gate (behind a producer
	// transaction that inserted while the core was busy, which may stay open
	// for minutes) and while the gate cannot be taken. A row a producer
	// committed then without a notification waits at most this long for a
	// claim to be sent. It does not grow: a producer that holds its
	// transaction open must not hold back the rows of the others for longer.
	// The price is a claim every LookEvery for as long as that transaction
	// stays open (docs/durability.md, "What the looks cost").
	LookEvery = 10 * time.Millisecond
)

// gateState is where the core stands with the gate (see Rest and Busy).
type gateState int

const (
	gateAwake   gateState = iota // busy: producers do not notify; the core will look again
	gateAsking                   // Rest sent, Resting not yet back
	gateResting                  // the gate is held: every producer notifies
)

type workerState int

const (
	starting workerState = iota // Spawn sent, no WorkerStarted yet
	ready                       // running, may be handed ids
	stopping                    // stdin closed, waiting for exit
	killed                      // SIGKILL sent, waiting for exit
)

type killCause int

const (
	killNone     killCause = iota
	killTimeout            // head-of-line message exceeded MAX_RUNTIME
	killProtocol           // the worker broke the protocol
	killGrace              // it did not exit within the stop grace period
	killNow                // immediate shutdown
)

// msg is a message a worker holds, with the crash-sentinel epoch of its claim.
// line is the standard input line of an INPUT = message stage, kept only while
// the message is claimed and not yet handed out: Write takes it away, so the
// core holds at most a stage's capacity of lines.
//
// trace is its trace context and claimed when the core took its claim in,
// kept only while the core reports passes (TracePasses); when it was handed
// out is its pass's (history.go).
type msg struct {
	id       int64
	epoch    string
	attempts int // the row's attempts column when it was claimed
	line     string
	trace    Trace
	claimed  time.Time
}

type worker struct {
	id        WorkerID
	stage     *stage
	state     workerState
	pid       int
	queue     []msg // handed over, unanswered, in order; queue[0] is the head
	headSince time.Time
	idleSince time.Time
	spawnedAt time.Time
	stopBy    time.Time // stopping: killed if not exited by then
	handed    int
	answered  int
	cause     killCause
	timedOut  int64  // killTimeout: the head that timed out
	protoLine string // killProtocol: what it said (its first 200 bytes)
	protoHow  int    // killProtocol: how (protoLine, protoCut, protoFirst)
	// emits: the emit lines of the head's pass so far (emit.go), at most
	// EMIT_MAX; emitErr, when set, why the head fails at its answer.
	emits   []Emit
	emitErr string
	// probe: spawned while its stage had to tell a program that cannot
	// start from a message that kills its workers (startFailed): it is
	// handed nothing until it has lived StartWindow.
	probe bool
	// tail: its output's last line, written without a newline, judged at
	// its exit (Answer.Unterminated); exited: its exit is being taken in.
	tail   *Answer
	exited bool
}

type stage struct {
	cfg conf.Stage
	// maxRuntime is the stage's watchdog: its own MAX_RUNTIME, or else the
	// dispatcher's.
	maxRuntime time.Duration
	workers    []*worker // in id order
	backlog    []msg     // claimed, not yet handed to a worker
	maybeMore  bool      // pending rows may exist: worth claiming
	// reserved counts the moves to this stage that the outstanding resolves
	// may claim (Item.Claim): room kept for them until their outcomes come.
	reserved int
	// claiming: the cap of the outstanding claim here, room a move that
	// claims beside it must leave (see claimMoves).
	claiming int
	// dry: the core knows of every row pending at the stage: its last claim
	// of the stage emptied it (took fewer rows than its cap, or found no more:
	// Claimed.More) with no notification meanwhile, and since then only its
	// own resolves made rows pending there, known counting them. A move that
	// claims needs it (core/moveclaim.go).
	dry   bool
	known int
	// lookOwed: a look (lookAbove) is owed at the stage, which no claim has
	// made yet; moves leave a slot of its room for that claim (moveRoom).
	lookOwed bool
	// movedIn: moves (or emitted children) claimed room here since the
	// stage's last claim was sent. Such a stage, full, is not looked at by a
	// claim that leaves it out (see lookedAt), though the moves'
	// reservations (reserved) may be back already: with SESSIONS above 1
	// their resolves go beside the full transaction and their results often
	// come first.
	movedIn bool
	// floor: the stage's claims look above this ingress_id only. No row is
	// pending at or below it that the core could know of: every pending row up
	// to it was claimed, and every row up to it had settled (Claimed.Settled).
	// Anything that may make older rows pending (a reset, a wake, a NOTIFY, the
	// heartbeat, the database coming back) sets it to zero; a resolve lowers the
	// claim in its own transaction below its items' ids (claimAfter).
	floor int64
	// headAt: the lowest id a Release of the outstanding transaction made
	// pending here (a key's new head), which its claim may not have walked
	// (it may sit below the floor); zero for none. Applied again after that
	// claim's result (see released).
	headAt        int64
	cooldownUntil time.Time
	cooldownStep  time.Duration
	cooldownAt    time.Time // when cooldownStep was last doubled: workers spawned since are a new round of starts
	cooldownFrom  time.Time // the spawn of the worker whose failed start began the cooldown's latest round: an answer of a worker spawned since ends it
	answeredAt    time.Time // the latest answer of any worker of the stage (waiting)
	startErr      string    // how the last failed start failed (health.go)
	// provenSpawn: the latest spawn of a worker that showed the stage's
	// program starts (it answered, or a probe lived StartWindow). A spawn,
	// not a count: a worker started before a message's first failed start
	// may run the program as it was before a deployment, and shows nothing
	// of the program as it is now. probe: the stage's next workers are
	// probes (startFailed), until a worker spawned at probeFrom or later
	// shows the program starts.
	provenSpawn time.Time
	probe       bool
	probeFrom   time.Time
	// programErr: why the stage's program cannot be run, as its last check
	// found (program.go), until a check passes or a worker starts; checked
	// again at programCheckAt.
	programErr     string
	programCheckAt time.Time
	// crashRun counts the workers that crashed in a row with no answer
	// between, and crashErr says how the last one did (health.go).
	crashRun    int
	crashErr    string
	stuckReason string  // the reason for a 0 that left the row running here
	rate        *bucket // RATE; nil for none
	pressure    pressure
	// emitDrops counts the emits that inserted nothing since emitLogAt was
	// last set, when they were last logged (emitsDropped).
	emitDrops int64
	emitLogAt time.Time
}

// Core is the dispatcher state machine. Create it with New; drive it with Step.
type Core struct {
	cfg     conf.Dispatch
	stages  []*stage // sorted by name
	byName  map[string]*stage
	workers map[WorkerID]*worker
	nextWID WorkerID
	nextOp  int64
	now     time.Time
	out     []Command

	started   bool
	resetDone bool // the start-up orphan reset has committed
	needReset bool // a ResetOrphans must precede the next Claim
	// sweep: the heartbeat's ResetOrphans. With one dispatcher, a running row this
	// core does not hold is an orphan whatever made it (a transaction of a session
	// that lost the lock committing late, a mistaken tool); every POLL_INTERVAL
	// such rows are made pending, so nothing stays running for long.
	sweep  bool
	dbDown bool
	// downSince: when the first queue transaction of an outage failed, zero
	// once one succeeds again; the operator who saw the failure's warning
	// then reads that writes go through again, and after how long.
	downSince time.Time
	// txns: the queue transactions awaiting results, oldest first; at most
	// cfg.Sessions of them (see queueWork).
	txns []*txnOut
	// tainted: stages at which a transaction other than the one of the
	// outstanding claim made rows pending while that claim was out; the
	// claim may not have seen them, so its result must not end their look
	// (see claimed).
	tainted map[string]bool
	// taintOn: the resolve being taken in is of such another transaction.
	taintOn bool
	owed    []Item // resolve items not yet sent (or sent and failed)
	// unsure: rows of resolve items sent in a transaction whose reply was lost.
	// That transaction may have applied them and then woken and claimed the same
	// rows again, so a reset after a lost claim must not keep them (see queueWork).
	unsure map[int64]bool
	// races: rows still running after their resolve (a commit raced it), by
	// how many resolves in a row found them so (see raced).
	races map[int64]int
	// keyWaits: owed items whose emits wait for a producer's order-key
	// lock (keywait.go).
	keyWaits keyWaits
	// keys: ordering per key (orderkey.go).
	keys orderKeys
	// checkDue: the heartbeat asks for a check of the MAX_PENDING limits even
	// if no claim is otherwise sent (pressure.go): something other than the
	// core's claims (an operator) may have brought a stage back under its.
	// So does a claim whose count could not show a stage back within its
	// limit (checkedLimits).
	checkDue bool
	// hist: pepsi.history's passes and partitions (history.go).
	hist history

	epoch      string
	nextPaused time.Time
	// txnPaused: the earliest due time of a row a resolve reported paused
	// since the outstanding wake was sent; its Woken.Next leaves that row out
	// when the wake kept it (see Wake).
	txnPaused  time.Time
	wakeDue    bool
	lastPoll   time.Time
	ingressGen int64
	claimGen   int64
	// settled: the highest Claimed.Settled seen; lookGen counts lookAll calls,
	// claimLookGen is its value when the outstanding claim was sent (a look
	// asked for meanwhile keeps the floors at zero).
	settled      int64
	lookGen      int64
	claimLookGen int64

	stats         map[string]*StageDelta
	passes        int64
	left          int64
	life          int64   // this core's life (Start.Life): half of every flush's identity
	flushSeq      int64   // the Seq of this life's last flush
	resendFlushes []Flush // flushes that may not have been applied: re-sent unchanged, first to last, before any new one
	lastFlush     time.Time
	startFails    map[int64]startFail

	health health // the queue table's health (vacuum.go)
	// gate: whether the dispatcher counts as waiting (see Rest). lastClaim is
	// when the core last sent a Claim; restRetryAt, after a failed Rest, when it
	// may ask again, and restRetry the pause after the next failure.
	gate gateState
	// lookAt: while the core relies on itself to find rows committed without
	// a notification (its Rest waits for the gate, or the gate could not be
	// taken), when it looks next (see lookUnwatched); zero otherwise.
	lookAt time.Time
	// lookedAt: when the core last sent a claim that looked at every stage
	// with room, or the periodic look; while busy it looks again LookEvery
	// after (see claimFor). A stage a claim leaves out because moves took
	// its room is not looked at: moves pass over the rows pending there, and
	// counted as looked at, a pipeline whose transactions follow each other
	// within LookEvery would never look again nor keep a slot (lookOwed), and
	// its moves would take every slot a worker frees while a row committed
	// there without a notification waited for the heartbeat. The look counts
	// whatever it leaves out: the stages it leaves out stay owed one, and
	// looking again in every transaction would mark them all owed each time.
	// A look that sends no claim (no stage can take a row: full, out of RATE
	// tokens or held, and no limit check due) is not counted: it stays due,
	// and each transaction marks the stages owed again until a claim looks,
	// which repeats what the first marked and sends nothing.
	lookedAt    time.Time
	lastClaim   time.Time
	restRetryAt time.Time
	restRetry   time.Duration

	rng uint64 // the pseudo-random source's state (random), seeded by Start

	// tracePasses: claims read every row's trace context and the core reports
	// each pass's end (TracePasses).
	tracePasses bool

	shutdown int // 0 running, 1 graceful, 2 immediate
	// shutdownFlushed: the statistics counted before the first shutdown
	// request have been sent (flushDue), so that a second request, which
	// writes nothing more, loses at most what was counted after it.
	shutdownFlushed bool
	waitLogged      bool
	exited          bool
	timer           time.Time
}

// New returns a core for the configuration. It does nothing until the Start event.
func New(cfg *conf.Config) *Core {
	c := &Core{
		cfg:        cfg.Dispatch,
		byName:     map[string]*stage{},
		workers:    map[WorkerID]*worker{},
		stats:      map[string]*StageDelta{},
		startFails: map[int64]startFail{},
		unsure:     map[int64]bool{},
		races:      map[int64]int{},
		keyWaits:   newKeyWaits(),
		tainted:    map[string]bool{},
		keys:       orderKeys{keyOf: map[int64]string{}, holder: map[string]int64{}, owed: map[string]bool{}},
		hist:       history{passes: map[int64]pass{}},
	}
	for _, sc := range cfg.Stages {
		st := &stage{cfg: sc, maxRuntime: cfg.Dispatch.RuntimeOf(sc), rate: newBucket(sc.Rate), stuckReason: fmt.Sprintf("stage %s answered 0 but left the message running at %s (stage bug)", sc.Name, sc.Name)}
		if sc.Input == conf.InputMessage {
			st.stuckReason = fmt.Sprintf("stage %s (INPUT = message) answered a bare 0, which leaves the message running at %s: a stage with no database must answer its transition (0 >TARGET)", sc.Name, sc.Name)
		}
		c.stages = append(c.stages, st)
		c.byName[sc.Name] = st
	}
	slices.SortFunc(c.stages, func(a, b *stage) int { return cmpString(a.cfg.Name, b.cfg.Name) })
	return c
}

// TracePasses makes the core report the end of every pass (Pass) with the
// trace context its claim read (Claim.Traces, Resolve.Traces), for a shell
// that exports traces. Call it before the first Step. Without it the core
// sends no Pass and keeps no trace context but the lines' own.
func (c *Core) TracePasses() { c.tracePasses = true }

// Step applies events at instant now and returns the commands to execute, in order.
func (c *Core) Step(now time.Time, evs ...Event) []Command {
	if c.exited {
		return nil
	}
	if now.Before(c.now) {
		now = c.now // time never runs backwards inside the core
	}
	c.now = now
	c.out = nil
	for _, ev := range evs {
		c.apply(ev)
	}
	if c.started {
		c.timers()
		c.programChecks()
		c.countRateHeld()
		c.inspectDue()
		c.assign()
		c.reapAfterAssign()
		c.queueWork()
		c.rest()
		c.finish()
		c.markRateHeld()
		c.setTimer()
	}
	out := c.out
	c.out = nil
	return out
}

func (c *Core) emit(cmd Command) { c.out = append(c.out, cmd) }

func (c *Core) logf(level Level, format string, args ...any) {
	c.emit(Log{Level: level, Msg: fmt.Sprintf(format, args...)})
}

func (c *Core) apply(ev Event) {
	switch e := ev.(type) {
	case Start:
		assert(!c.started, "second Start event")
		c.started = true
		c.needReset = true
		c.wakeDue = true
		c.lastPoll = c.now
		c.lastFlush = c.now
		c.lastClaim = c.now
		c.life = e.Life
		for _, f := range e.Carry {
			if f.Seq == 0 {
				c.addFlush(f) // counted, never sent: this life sends it as its own
			} else {
				c.resendFlushes = append(c.resendFlushes, f)
			}
		}
		c.rng = e.Seed
		for _, p := range e.Unrunnable {
			c.programChecked(c.byName[p.Stage], p.Err)
		}
		for _, st := range c.stages {
			// Empty at the start: the last core may have spent a whole
			// burst just before it died, and a full bucket now would claim
			// a second one within the same window.
			st.rate.empty(c.now)
		}
		c.lookAll()
	case Ingress:
		c.ingressGen++
		c.lookAll()
		// A producer may have inserted a scheduled message, paused until its
		// not_before, earlier than any pause the core knows of (those of its
		// own writes and its last wake): the next transaction wakes, and so
		// learns the earliest due time again (Woken.Next). Such an insert
		// notifies even while the core is busy.
		c.wakeDue = true
	case Resting:
		c.resting(e)
	case RestLost:
		c.restLost()
	case Tick:
	case Shutdown:
		c.beginShutdown()
	case DatabaseUp:
		c.databaseUp()
	case WorkerStarted:
		c.workerStarted(e)
	case SpawnFailed:
		c.spawnFailed(e)
	case ProgramChecked:
		c.programChecked(c.byName[e.Stage], e.Err)
	case Answer:
		c.answer(e)
	case WorkerExited:
		c.exitedWorker(e)
	case Claimed:
		c.claimed(e)
	case Resolved:
		c.resolved(e)
	case Woken:
		c.woken(e)
	case Released:
		c.released(e)
	case OrphansReset:
		c.orphansReset(e)
	case Inspected:
		c.inspected(e)
	case Vacuumed:
		c.vacuumed(e)
	case Flushed:
		c.flushed(e)
	case HistoryKept:
		c.historyKept(e)
	default:
		panic(fmt.Sprintf("core: unknown event %T", ev))
	}
}

// databaseUp ends an outage the core knew of: what it owes is sent again, and
// it looks for work everywhere.
func (c *Core) databaseUp() {
	if !c.dbDown {
		return
	}
	c.dbDown = false
	c.wakeDue = true
	c.lookAll()
	// The failure may have been a day of pepsi.history that is missing
	// (dropped behind the dispatcher's back: retention by hand, a restore),
	// which only the upkeep makes again: without it every try would fail the
	// same way, the whole pipeline waiting, until the hourly upkeep. So the
	// next transaction begins with one; it costs a look at the catalog.
	c.hist.next = time.Time{}
	if _, out := c.claimOut(); out {
		// A claim of another session still out must not end this look
		// with its result (see claimed).
		for _, st := range c.stages {
			c.tainted[st.cfg.Name] = true
		}
	}
	// The watchdog does not run while the database is down (a worker cannot
	// commit then); heads get a fresh MAX_RUNTIME from now.
	for _, w := range c.workers {
		if len(w.queue) > 0 {
			w.headSince = c.now
		}
	}
}

// setTimer asks for a Tick at the earliest instant something becomes due.
func (c *Core) setTimer() {
	if c.exited {
		return
	}
	var next time.Time
	at := func(t time.Time) { next = earliest(next, t) }
	// While a transaction is outstanding or the database is down, its result or
	// DatabaseUp wakes the core: a queue deadline then would only spin.
	// After a second shutdown request nothing more is written either.
	queueBlocked := c.dbDown || len(c.txns) > 0 || c.shutdown == 2
	at(c.inspectAt())
	at(c.lookTimer())
	if c.shutdown == 0 {
		at(c.lastPoll.Add(c.cfg.PollInterval))
		if !queueBlocked {
			at(c.nextPaused)
			at(c.hist.next)
		}
	}
	for _, w := range c.workers {
		switch w.state {
		case ready:
			if len(w.queue) > 0 {
				if !c.dbDown {
					at(w.headSince.Add(w.stage.maxRuntime))
				}
			} else if w.handed < w.stage.cfg.MaxMessages && (!w.probe || len(w.stage.backlog) == 0) {
				// (A probe is idle beside a backlog until StartWindow: it is
				// reaped only as any worker is, with nothing waiting.)
				at(w.idleSince.Add(c.cfg.IdleTimeout))
			}
			if w.probe {
				at(w.spawnedAt.Add(StartWindow))
			}
		case stopping:
			at(w.stopBy)
			if len(w.queue) > 0 && !c.dbDown {
				at(w.headSince.Add(w.stage.maxRuntime))
			}
		}
	}
	for _, st := range c.stages {
		// A cooling stage with work waiting (claimed, or requeued and pending)
		// is retried when the cooldown ends, not at the next heartbeat.
		if st.coolingDown(c.now) && (len(st.backlog) > 0 || st.maybeMore) {
			at(st.cooldownUntil)
		}
		if c.shutdown == 0 {
			at(st.programCheckAt) // zero (no timer) unless its program's check failed
		}
		// A stage held by its rate is claimed when its next token is due,
		// not at the next heartbeat (nor by polling before).
		if !queueBlocked && c.rateHeld(st) {
			at(st.rate.nextToken())
		}
	}
	if c.restReady() {
		at(c.restAt())
	}
	if !c.lookAt.IsZero() && !queueBlocked {
		at(c.lookAt)
	}
	if !queueBlocked {
		at(c.keysDueAt())
	}
	if c.hasDeltas() && !queueBlocked {
		at(c.lastFlush.Add(c.cfg.StatsInterval))
		if c.idle() {
			at(c.lastFlush.Add(IdleFlushMin))
		}
	}
	if next.Before(c.now) && !next.IsZero() {
		next = c.now
	}
	if !next.Equal(c.timer) {
		c.timer = next
		c.emit(SetTimer{At: next})
	}
}

func assert(ok bool, format string, args ...any) {
	if !ok {
		panic("core: invariant broken: " + fmt.Sprintf(format, args...))
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
