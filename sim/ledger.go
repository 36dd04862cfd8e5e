package sim

// The checker's ledger: what it knows of the core's life, filled from the
// events the world hands the core (modelEvent), the commands the rules let
// through (recordCommand) and the fake queue's changes (observe, check.go);
// and, beside it, what each rule keeps for itself.

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
)

type killCause int

const (
	causeNone     killCause = iota
	causeTimeout            // the watchdog: the head ran past MAX_RUNTIME
	causeProtocol           // the worker wrote a line that is not a status line
	causeGrace              // it did not exit within STOP_GRACE of being stopped
	causeNow                // second shutdown request
)

// wmodel is what the checker knows of one worker of the current life.
type wmodel struct {
	id        core.WorkerID
	stage     int
	spawnAt   time.Time
	started   bool // WorkerStarted delivered while it was starting: ready
	gone      bool // SpawnFailed or WorkerExited delivered
	goneStep  int  // the step that delivered it
	stopped   bool
	stoppedAt time.Time
	killed    bool
	cause     killCause
	timedOut  int64
	proto     bool         // it broke the protocol: the core ignores it from then on
	queue     []int64      // handed and not answered, in order
	handed    int          // ids ever handed
	answered  int          // answers the core took
	headSince time.Time    // when queue[0] became the head, as the core saw it
	idleSince time.Time    // when it last had nothing to do
	answers   []answerInfo // lines written, not yet delivered
	emits     []answerInfo // emit lines the core took for its head's pass (emit.go)
	pass      string       // the pass of the last status line it answered (emit.go; "" for none that emitted)
	probe     bool         // spawned as a probe (coolState.probe)
	tail      *answerInfo  // its last line, without a newline: judged at its exit (core.Answer.Unterminated)
}

// expect is how the core must resolve a message it no longer hands to a worker.
type expect struct {
	verdict core.Verdict
	why     string
	stage   string     // the stage it was claimed for
	epoch   string     // answered 0: the epoch of its claim
	reason  string     // a non-zero answer's reason ("" when the line had none)
	answer  bool       // answered 0: failing it is right only if the stage did not write
	move    *core.Item // answered a transition: the To, Until and Patch the item must carry
	emits   int        // answered a transition: the messages its pass emitted (emit.go)
	pass    string     // answered: the pass that emitted before the answer (emit.go), "" for none
	// retryFrom and retryTo bound a Retry's timeout: [delay, delay × (1 +
	// core.RetryJitter)) after the answer.
	retryFrom, retryTo time.Time
	sentOp             int64          // the op of the outstanding resolve its item is in (0: none)
	claim              bool           // its item, in the outstanding transaction, claims its row at its target (core.Item.Claim)
	unsure             bool           // its item was in a transaction whose reply was lost
	sentReason         string         // the reason of its item as the core last sent it
	sentStatus         core.RowStatus // the status its item writes, if it fails or times out the row
	raced              bool           // a resolve of it found the row still running (a commit landed meanwhile)
	crash              bool           // failed as the head of a worker that crashed, broke the protocol or could not start (history: crashed)
	// keyBusyAt: when a resolve of its item last came back KeyBusy (a
	// child's order key locked by a producer); zero once sent again.
	keyBusyAt time.Time
}

// truth is what one core life did, counted from the world.
type truth struct {
	stages map[string]*core.StageDelta
	passes int64
	left   int64
	exact  bool // its statistics must all have been flushed
	// carriedFrom is the life whose unflushed statistics this life was handed
	// at Start (it lost its lock), 0 if none; carried is what of them the core
	// took on (the flushes its start-up reset showed unapplied).
	carriedFrom int
	carried     *truth
}

func (t *truth) stage(name string) *core.StageDelta {
	d := t.stages[name]
	if d == nil {
		d = &core.StageDelta{Stage: name}
		t.stages[name] = d
	}
	return d
}

type cooldown struct {
	step  time.Duration
	until time.Time
	at    time.Time // the instant of the failed start that set step: workers spawned since are a new round
	from  time.Time // the spawn of the worker whose failed start began it: only a worker spawned since ends it
}

// model is everything the checker keeps: the ledger of what it knows, and
// beside it the state each rule derives for itself from the ledger's history
// (each group names the rules that own it).
type model struct {
	ledger
	rowFacts
	promptState
	gateState
	wakeState
	rateState
	coolState
	healthState
	flushState
	truthState
	pressureState
	floorState
}

// floorState belongs to rule claim-floor.
type floorState struct {
	// releaseAsked: the keys of each outstanding Release, by Op; keysBusy:
	// keys a release found busy (a producer held the key's lock) and no
	// release of this life has handed on since. The core releases such a key
	// again, and lowers the floor when that release reports the key's head:
	// until then a claim's floor may pass over the head.
	releaseAsked map[int64][]string
	keysBusy     map[string]bool
}

// ledger is what the checker knows of the current core life: observable facts
// only, filled from the events the world hands the core, the commands the core
// returns and the fake queue's changes. It judges nothing; the rules do.
type ledger struct {
	shut int // shutdown signals delivered
	// shutFlushed: a flush of this life was sent after the first shutdown
	// request (the core sends the statistics counted before it at once).
	shutFlushed bool
	coreDown    bool // the core saw a failed transaction and no DatabaseUp since
	// txnsOut: the queue transactions outstanding, in the order sent (see
	// txnOut).
	txnsOut   []txnModel
	resetSent bool // the start-up orphan reset was sent
	// resetOwed: a transaction whose reply was lost may have left rows
	// running that the core never learned of (its claim's, its moves' or
	// emits' that claim); the next one must reset them (rule
	// reset-after-loss).
	resetOwed bool
	resetSeen bool // the start-up reset's result came back
	resting   bool // the core holds the gate as far as it knows (Resting, no Busy since)
	// Who holds which id: workers (and what each holds, in order), the rows
	// claimed and not handed out (backlog: id -> stage), the worker holding
	// each handed id, and the verdicts owed for ids the core stopped holding
	// (expects), with how the core must resolve them.
	workers map[core.WorkerID]*wmodel
	alive   []*wmodel // the workers not gone, in id order
	backlog map[int64]string
	holder  map[int64]core.WorkerID
	expects map[int64]*expect
	// What each held message was claimed with: its claim's epoch, the claim
	// (see rowFacts.claimGen) it came with, and its attempts column.
	claimEpoch    map[int64]string
	claimGenOf    map[int64]int
	claimAttempts map[int64]int
	claimCaps     []core.Cap   // the caps of the claim outstanding
	startCarry    []core.Flush // what Start carried
	// movesOut: per outstanding resolve (by op), per stage, its moves that
	// claim their row there (core.Item.Claim) and its children inserted
	// running there; lastEpoch: the epoch of this life's last claim, which a
	// row a move claims is held with.
	movesOut  map[int64]map[string]int
	lastEpoch string
}

// rowFacts is what the checker knows of the queue's rows over every life,
// from the fake queue's changes.
type rowFacts struct {
	claimGen []int // per row (id-1): how many times a claim took it
	// retried: rows an operator made pending again, until a claim takes them,
	// with when the core heard of it (a NOTIFY, or anything else after which it
	// must look at every stage); zero while it has not. Until then a claim's
	// floor may pass over them: the core cannot know.
	retried map[int64]time.Time
	// strayed: rows a stray tool made running (fakequeue.Stray), with their
	// claimGen then plus one: while it is unchanged the row is an orphan no
	// core knows of, the heartbeat's sweep's or the next start-up's to reset.
	strayed  map[int64]int
	execLife int // the life whose transaction the fake queue is applying
}

// promptState belongs to rules promptness, rate-token-due and
// cooldown-end-due.
type promptState struct {
	// told: per stage, whether the core has been told that rows may be pending
	// there and has not since claimed it dry.
	told []bool
	// toldLook: per stage, whether told is owed to anything but the core's
	// own resolves (a notification, a look, a claim that found more), and
	// ownPending how many rows its resolves left pending there since its last
	// claim found the stage dry: rule move-claims's derivation of what the
	// core knows is pending at a move's target.
	toldLook   []bool
	ownPending []int
	toldInTxn  bool      // a notification came while the claim was outstanding
	lastPoll   time.Time // the heartbeat's last instant (POLL_INTERVAL)
	stepFree   bool      // the step could start a queue transaction
}

// gateState belongs to rule no-wait-for-heartbeat.
type gateState struct {
	// unnotified: rows whose producer did not notify (the gate was free: the
	// dispatcher counted as busy), with when they committed and when their
	// clock last started (their commit, or the last instant their stage could
	// not be claimed), until the core claims their stage or looks after taking
	// the gate.
	unnotified map[int64]unnotified
}

// unnotified is a row committed without a notification, as rules
// no-wait-for-heartbeat and moves-leave-the-look-a-slot follow it.
type unnotified struct {
	committed time.Time // when its producer committed it
	since     time.Time // when its clock started: its commit, or the last instant its stage had no room
}

// wakeState belongs to rule wake-due.
type wakeState struct {
	// unseen: rows a producer inserted scheduled (paused until their
	// not_before) whose time the core cannot know yet: no notification sent
	// after their commit has reached it (it may have been lost), and it had
	// no other reason to wake since (its start, the heartbeat, the database
	// coming back).
	unseen map[int64]bool
}

// wakeComing records that the core's next transaction wakes, after every
// commit so far: every scheduled row's time is known to it from then on.
func (w *world) wakeComing() { clear(w.unseen) }

// rateState belongs to rules rate and rate-token-due.
type rateState struct {
	// rateLog: per stage with a RATE, the claims this life sent for it: when,
	// when their result came, and how many rows they took (their cap while the
	// result is out or when it was lost). rateOut: the index in it of the
	// outstanding claim's entry.
	rateLog   [][]rateClaim
	rateOut   map[int]int
	startedAt time.Time // when the core got its Start: its buckets are empty then
}

// coolState belongs to rules cooldown and item-verdict (a head of
// core.StartFailLimit failed starts fails).
type coolState struct {
	cool       []cooldown
	startFails map[int64]startFailModel
	// provenSpawn, per stage, the latest spawn of a worker that showed its
	// program starts (an answer, a probe that lived core.StartWindow): a
	// worker spawned before a message's first failed start proves nothing
	// against it. probe: the stage's next workers are probes, handed nothing
	// until they have, until a worker spawned at probeFrom or later proves.
	provenSpawn []time.Time
	probe       []bool
	probeFrom   []time.Time
	// answeredAt, per stage, the latest answer of any of its workers (rule
	// pressure-holds: what waits for a stage counts only while none
	// answered since the latest round of failed starts).
	answeredAt []time.Time
}

// startFailModel is a message's run of failed starts at a worker's head, and
// when the worker of the first was spawned.
type startFailModel struct {
	n          int
	firstSpawn time.Time
}

// proveStage: worker x showed its stage's program, as x was started with
// it, starts; the stage's probes are workers like the others from now on if
// x was spawned since the probing began.
func (w *world) proveStage(x *wmodel) {
	i := x.stage
	if x.spawnAt.After(w.provenSpawn[i]) {
		w.provenSpawn[i] = x.spawnAt
	}
	if !w.probe[i] || w.provenSpawn[i].Before(w.probeFrom[i]) {
		return
	}
	w.probe[i] = false
	for _, y := range w.alive {
		if y.stage == i && y.probe {
			y.probe, y.idleSince = false, w.now // idle from now: it could be handed nothing
		}
	}
}

// provenByProbes takes in, as the core's step does after its events, the
// probes that have lived core.StartWindow.
func (w *world) provenByProbes() {
	if w.shut > 0 {
		return // the core stopped every worker at the request: none proves
	}
	for _, y := range w.alive {
		if y.probe && y.started && !y.gone && !y.stopped && !y.killed && !y.proto && !w.now.Before(y.spawnAt.Add(core.StartWindow)) {
			w.proveStage(y)
		}
	}
}

// healthState belongs to rules inspect-serial, inspect-due,
// vacuum-only-when-called-for and vacuum-when-due: an Inspect outstanding and
// when the last was sent, a Vacuum outstanding and when the last was sent, the
// last inspection's result, and one delivered in this step.
type healthState struct {
	inspectOut    bool
	inspectSent   time.Time
	vacuumOut     bool
	vacuumSent    time.Time
	lastInspected *core.Inspected
	inspectedNow  *core.Inspected
	vacuumedNow   bool // the step's commands include a Vacuum
	// inspectCmdAt is when this core life sent its last Inspect (zero:
	// none yet); settledSeen the highest Claimed.Settled it has been
	// given, settledAtInspect that when it sent the last Inspect, and
	// liveInspected the live rows of its last inspection.
	inspectCmdAt                                 time.Time
	settledSeen, settledAtInspect, liveInspected int64
	// claimSeen: this core life has been given a claim's result;
	// baselineOwed: its last Inspect went out before any, so growth
	// counts from the first one's Settled, not from the ids the queue
	// had handed out before the life began (Scenario.idBase).
	claimSeen, baselineOwed bool
}

// pressureState belongs to rules pressure-holds, pressure-held-only-while-over
// and pressure-never-stops: what the core of this life learned of
// back-pressure, as the checker derives it from what crossed. feeds: per
// stage, the stages with a MAX_PENDING its passes sent messages to (an
// answered transition, a pending row at another stage in a resolve's
// outcome for an item that was not a requeue), as core.Core learns them;
// over: per stage, whether the last claim that checked its MAX_PENDING found
// more pending; limitsOut: the limits of the claim outstanding.
type pressureState struct {
	feeds     [][]int
	over      []bool
	limitsOut []core.Limit
}

// flushState belongs to rules flush-not-empty, flush-sequenced,
// flush-not-early and flush-not-late.
type flushState struct {
	flushedAt time.Time   // when the core made its last new flush (or started)
	lastFlush *core.Flush // the last flush it sent
	issued    *truth      // what its new flushes carried, summed
}

// truthState belongs to rule statistics-exact: each life's truth, and the
// rows this life's resolves failed or timed out until the core hears of it.
type truthState struct {
	truths   []*truth
	verdicts map[int64]core.RowStatus
}

// newLifeModel starts the checker's model of a new core life: everything of
// the last life is forgotten but what lives across lives (rowFacts, the
// truths) and what Start carried.
func (w *world) newLifeModel() {
	n := len(w.sc.stages)
	w.ledger = ledger{
		workers: map[core.WorkerID]*wmodel{}, backlog: map[int64]string{}, holder: map[int64]core.WorkerID{},
		expects: map[int64]*expect{}, claimEpoch: map[int64]string{}, claimGenOf: map[int64]int{},
		claimAttempts: map[int64]int{}, startCarry: w.startCarry, movesOut: map[int64]map[string]int{},
	}
	w.promptState = promptState{told: make([]bool, n), toldLook: make([]bool, n), ownPending: make([]int, n), lastPoll: w.lastPoll}
	w.gateState = gateState{unnotified: map[int64]unnotified{}}
	w.wakeState = wakeState{unseen: map[int64]bool{}}
	w.rateState = rateState{rateLog: make([][]rateClaim, n), rateOut: map[int]int{}}
	w.coolState = coolState{cool: make([]cooldown, n), startFails: map[int64]startFailModel{}, provenSpawn: make([]time.Time, n), probe: make([]bool, n), probeFrom: make([]time.Time, n), answeredAt: make([]time.Time, n)}
	w.healthState = healthState{}
	w.pressureState = pressureState{feeds: make([][]int, n), over: make([]bool, n)}
	w.floorState = floorState{releaseAsked: map[int64][]string{}, keysBusy: map[string]bool{}}
	w.flushState = flushState{flushedAt: w.flushedAt, issued: &truth{stages: map[string]*core.StageDelta{}}}
	w.verdicts = map[int64]core.RowStatus{}
	t := &truth{stages: map[string]*core.StageDelta{}, carried: &truth{stages: map[string]*core.StageDelta{}}}
	if len(w.startCarry) > 0 {
		t.carriedFrom = len(w.truths)
	}
	w.truths = append(w.truths, t)
}

// lookAll records that the core must look at every stage now, and so answers
// for every row committed without a notification so far (the promptness
// obligation takes over).
func (w *world) lookAll() {
	w.tellAll()
	if w.claimCaps != nil {
		w.toldInTxn = true
	}
	clear(w.unnotified)
}

// tellAll records that the core learnt rows may be pending at every stage, at
// any id.
func (w *world) tellAll() {
	for s := range w.told {
		w.told[s] = true
		w.toldLook[s] = true
	}
	for id, at := range w.retried {
		if at.IsZero() {
			w.retried[id] = w.now
		}
	}
}

func (w *world) truth() *truth { return w.truths[w.life-1] }

// ---- events, applied in batch order, as the core applies them ----

func (w *world) modelEvent(ev core.Event) {
	switch e := ev.(type) {
	case core.Start:
		w.flushedAt = w.now
		w.startedAt = w.now
		w.lastPoll = w.now
		w.inspectSent = w.now
		// A new core: it has inspected nothing and seen no claim yet.
		w.inspectCmdAt, w.settledSeen, w.settledAtInspect, w.liveInspected = time.Time{}, 0, 0, 0
		w.claimSeen, w.baselineOwed = false, false
		w.tellAll()
		w.wakeComing()
	case core.Inspected:
		w.inspectOut = false
		if e.Err == "" {
			in := e
			w.lastInspected, w.inspectedNow = &in, &in
			w.liveInspected = e.Live
		}
	case core.Vacuumed:
		w.vacuumOut = false
	case core.Ingress:
		w.tellAll()
		w.wakeComing()
		if w.claimCaps != nil {
			// Rows may have come after the outstanding claim looked.
			w.toldInTxn = true
		}
	case core.Resting:
		// The last look: every producer that did not notify has committed, so
		// the core must claim every stage with room in this step. (A gate it
		// could not take means no one notifies: it must look all the same.)
		w.resting = e.Err == ""
		w.lookAll()
	case core.RestLost:
		if w.resting {
			w.resting = false
			w.lookAll()
		}
	case core.Shutdown:
		w.modelShutdown()
	case core.DatabaseUp:
		w.modelDatabaseUp()
	case core.WorkerStarted:
		w.modelStarted(e)
	case core.SpawnFailed:
		w.modelSpawnFailed(e)
	case core.Answer:
		w.modelAnswer(e)
	case core.WorkerExited:
		w.modelExit(e)
	case core.Claimed:
		w.settledSeen = max(w.settledSeen, e.Settled)
		if e.Err == "" {
			w.claimSeen = true
			if w.baselineOwed {
				w.baselineOwed, w.settledAtInspect = false, w.settledSeen
			}
		}
		w.modelClaimed(e)
	case core.Resolved:
		w.modelResolved(e)
	case core.Woken:
		w.txnResult(e.Op, e.Err)
		if e.Count > 0 {
			w.tellAll()
		}
	case core.Released:
		w.modelReleased(e)
	case core.OrphansReset:
		w.modelReset(e)
	case core.Flushed:
		w.txnResult(e.Op, e.Err)
	case core.HistoryKept:
		w.txnResult(e.Op, e.Err)
	}
}

// modelShutdown: at the first request the claimed rows not handed out are owed
// back.
func (w *world) modelShutdown() {
	w.shut++
	if w.shut == 1 {
		for _, id := range sortedKeys(w.backlog) {
			w.expects[id] = &expect{verdict: core.Requeue, why: "claimed but not handed out at shutdown", stage: w.backlog[id]}
		}
		clear(w.backlog)
	}
}

// modelDatabaseUp ends an outage the core saw.
func (w *world) modelDatabaseUp() {
	if w.coreDown {
		// The watchdog does not run while the database is down; heads get a
		// fresh MAX_RUNTIME (core.Core's documented rule).
		w.coreDown = false
		w.tellAll()
		w.wakeComing()
		for _, x := range w.alive {
			if len(x.queue) > 0 {
				x.headSince = w.now
			}
		}
	}
}

// modelStarted: a starting worker that was neither stopped nor killed is
// ready.
func (w *world) modelStarted(e core.WorkerStarted) {
	x := w.workers[e.Worker]
	if x == nil {
		w.broke(ruleWorldConsistent, "WorkerStarted for unknown %s", e.Worker)
		return
	}
	if !x.stopped && !x.killed && !x.started {
		x.started = true
		x.idleSince = w.now
	}
}

// modelSpawnFailed: a program that cannot be executed cools its stage down.
func (w *world) modelSpawnFailed(e core.SpawnFailed) {
	x := w.workers[e.Worker]
	w.bury(x)
	w.coolDown(x.stage, x.spawnAt)
	w.giveBackClaimed(x.stage)
}

// giveBackClaimed: after a failed start that left stage i no live worker,
// none can take its claimed rows before the cooldown ends, so the core gives
// them back (core.Core's documented rule).
func (w *world) giveBackClaimed(i int) {
	if w.live(i) > 0 {
		return
	}
	name := w.sc.stages[i].name
	for _, id := range sortedKeys(w.backlog) {
		if w.backlog[id] == name {
			delete(w.backlog, id)
			w.expects[id] = &expect{verdict: core.Requeue, why: "claimed for a stage that cannot start a worker", stage: name}
		}
	}
}

// modelClaimed takes in a claim's result: the rows it took join the backlog
// (or are owed back during a shutdown), the rate log learns what it took, and
// a stage claimed dry is no longer owed a claim.
func (w *world) modelClaimed(e core.Claimed) {
	w.txnResult(e.Op, e.Err)
	caps, told := w.claimCaps, w.toldInTxn
	w.claimCaps, w.toldInTxn = nil, false
	limits := w.limitsOut
	w.limitsOut = nil
	if e.Err == "" {
		for _, l := range limits {
			s := w.stageIndex(l.Stage)
			now := slices.Contains(e.Over, l.Stage)
			if !now && w.over[s] && w.unproven(s) && slices.ContainsFunc(e.Rows, func(r core.Row) bool { return r.Stage == l.Stage }) {
				// Its count, made after it took rows of the stage's own
				// that wait for the stage still, does not show an unproven
				// stage back within its limit (rule pressure-holds).
				continue
			}
			w.over[s] = now
		}
	}
	if e.Err != "" {
		// The claim may have taken its whole cap (unless it certainly
		// aborted): the core counts it so, and must reset what it took.
		w.resetOwed = w.resetOwed || !e.Aborted
		for _, s := range sortedKeys(w.rateOut) {
			w.rateLog[s][w.rateOut[s]].done = w.now
			if e.Aborted {
				w.rateLog[s][w.rateOut[s]].n = 0 // it certainly took nothing
			}
			w.checkAt(atEvent, crossing{rated: &s})
		}
		clear(w.rateOut)
		return
	}
	for _, cp := range caps {
		got := 0
		for _, r := range e.Rows {
			if r.Stage == cp.Stage {
				got++
			}
		}
		if i, ok := w.rateOut[w.stageIndex(cp.Stage)]; ok {
			s := w.stageIndex(cp.Stage)
			w.rateLog[s][i].n, w.rateLog[s][i].done = got, w.now
			delete(w.rateOut, s)
			if w.checkAt(atEvent, crossing{rated: &s}); w.fail != nil {
				return
			}
		}
		// A claim whose walk found no more than its cap (Claimed.More) found
		// the stage dry, unless a notification came while it was outstanding.
		s := w.stageIndex(cp.Stage)
		w.told[s] = slices.Contains(e.More, cp.Stage) || told
		w.toldLook[s], w.ownPending[s] = w.told[s], 0
	}
	w.lastEpoch = e.Epoch
	for _, r := range e.Rows {
		if !w.takeClaimed("claim", r.ID, r.Stage, r.Attempts, e.Epoch) {
			return
		}
	}
}

// takeClaimed takes in a row the core now holds for stage, returned by what
// (a claim, or a move that claims) with attempts under the crash sentinel's
// epoch: it must read the row's attempts and not be held already; it goes to
// the backlog (or, during a shutdown, is owed back as a requeue). It reports
// false when a rule broke.
func (w *world) takeClaimed(what string, id int64, stage string, attempts int, epoch string) bool {
	if w.checkAt(atEvent, crossing{took: &took{what: what, id: id, attempts: attempts}}); w.fail != nil {
		return false
	}
	w.claimAttempts[id] = attempts
	w.claimEpoch[id] = epoch
	w.claimGenOf[id] = w.claimGen[w.slot(id)]
	if w.shut > 0 {
		w.expects[id] = &expect{verdict: core.Requeue, why: "returned by " + what + " during shutdown", stage: stage}
	} else {
		w.backlog[id] = stage
	}
	return true
}

// modelResolved takes in a resolve's outcomes: what the core no longer owes,
// and what the truth counts of them.
func (w *world) modelResolved(e core.Resolved) {
	w.txnResult(e.Op, e.Err)
	moves := w.movesOut[e.Op]
	delete(w.movesOut, e.Op)
	if e.Err != "" {
		// A send that may have committed may have written its items; an
		// aborted one (the fake queue says so only when it did not
		// apply) wrote nothing, so a later miss is a miss.
		for _, ex := range w.expects {
			if ex.sentOp == e.Op {
				ex.sentOp, ex.unsure, ex.claim = 0, ex.unsure || !e.Aborted, false
			}
		}
		if !e.Aborted && len(moves) > 0 {
			w.resetOwed = true // its moves or emits may have claimed
		}
		return
	}
	for _, o := range e.Outcomes {
		if _, ok := w.expects[o.ID]; !ok {
			w.broke(ruleWorldConsistent, "outcome for message %d, which was not being resolved", o.ID)
			return
		}
		ex := w.expects[o.ID]
		if o.KeyBusy {
			// Nothing written: a child's order key is locked by a producer
			// in flight, and the core owes the same item again; during a
			// shutdown, which does not wait for that producer, it owes a
			// requeue of the row instead (the pass runs again at the next
			// start, emits and all).
			ex.sentOp, ex.claim, ex.keyBusyAt = 0, false, w.now
			if w.shut > 0 {
				w.expects[o.ID] = &expect{verdict: core.Requeue, why: "its child's order key locked by a producer during a shutdown", stage: ex.stage, unsure: ex.unsure}
			}
			continue
		}
		if s, ok := w.stageOf(ex.stage); ok && ex.verdict != core.Requeue && o.Status == core.StatusPending && o.Stage != ex.stage {
			w.learnFeed(s, o.Stage) // the pass sent its message on
		}
		switch {
		case ex.verdict == core.Move && o.Refused != "" && o.Status != core.StatusRunning:
			// The database refused the pass's outcome: its failure was
			// written instead (counted as the resolve's failure, below),
			// its emits dropped.
			w.truth().stage(ex.stage).EmitsDropped += int64(ex.emits)
		case ex.verdict == core.Move && o.Matched && o.Refused == "":
			w.truth().stage(ex.stage).Emitted += int64(ex.emits)
		case ex.verdict == core.Move && ex.unsure && !o.Matched && refusedFailure(o):
			// A send whose reply was lost wrote that failure: this one
			// counts what that one would have.
			w.truth().stage(ex.stage).EmitsDropped += int64(ex.emits)
		}
		for _, ch := range o.Children {
			// Inserted running by an emit that claims: the core's, as a
			// claim's row is.
			if !w.takeClaimed("an emit that claims", ch.ID, ch.Stage, 0, w.lastEpoch) {
				return
			}
		}
		if o.Status == core.StatusRunning && ex.claim && o.Matched {
			if w.modelMovedClaimed(o); w.fail != nil {
				return
			}
			continue
		}
		ex.claim = false
		if o.Status == core.StatusRunning {
			// A stage's commit landed while the resolve waited on the row:
			// nothing written, a guard miss, and the core still holds the
			// row and owes the same item.
			ex.sentOp, ex.raced = 0, true
			w.truth().stage(ex.stage).GuardMisses++
			continue
		}
		delete(w.expects, o.ID)
		if o.Status.Final() {
			w.truth().left++
		}
		if ex.verdict == core.Retry && o.Matched {
			w.truth().stage(ex.stage).Retries++
		}
		if guardedVerdict(ex.verdict) && o.Refused == "" && !o.Matched && !ex.unsure && !ex.raced {
			// The row was no longer running at the stage: a guard miss (unless
			// an earlier send, whose reply was lost, wrote it) of an outcome
			// the dispatcher decided; a move's emits are dropped with it.
			w.truth().stage(ex.stage).GuardMisses++
			w.truth().stage(ex.stage).EmitsDropped += int64(ex.emits)
		}
		if o.Status == core.StatusPending {
			if s, ok := w.stageOf(o.Stage); ok {
				w.told[s] = true
				w.ownPending[s]++
			}
		}
		v, ok := w.verdicts[o.ID]
		if !ok && ex.unsure && !o.Matched && ex.sentStatus != "" && o.Status == ex.sentStatus && o.Error == ex.sentReason {
			// The lost send did not write it: the stage wrote the status
			// itself, and the row's reason, left by an earlier retry, is
			// this verdict's. Nothing the core can read tells the two apart,
			// so it counts the verdict as its own (docs/pepsi-dispatch.1.md,
			// "Statistics"); the truth counts what the core can know.
			v, ok = o.Status, true
		}
		if ok {
			// The core learns now that its resolve failed or timed out the row.
			delete(w.verdicts, o.ID)
			if v == core.StatusFailed {
				w.truth().stage(o.Stage).Failed++
			} else {
				w.truth().stage(o.Stage).Timeouts++
			}
		}
	}
}

// guardedVerdict: an item of verdict v whose guard missed is a guard miss
// (a move, a failure, a timeout or a retry; not a requeue nor a bare 0).
func guardedVerdict(v core.Verdict) bool {
	return v == core.Move || v == core.Fail || v == core.TimeOut || v == core.Retry
}

// modelMovedClaimed takes in a row its resolve moved and claimed (a move that
// claims): the core holds it for its new stage as if a claim had returned it,
// with the epoch of its last claim.
func (w *world) modelMovedClaimed(o core.Outcome) {
	delete(w.expects, o.ID)
	w.takeClaimed("a move that claims", o.ID, o.Stage, o.Attempts, w.lastEpoch)
}

// modelReset takes in an orphan reset; the first of a life shows which
// carried flushes the core takes on.
func (w *world) modelReset(e core.OrphansReset) {
	w.txnResult(e.Op, e.Err)
	if e.Err != "" {
		return
	}
	if e.Count > 0 {
		w.tellAll()
	}
	w.tellHeads(e.Heads)
	for _, k := range e.Busy {
		w.keysBusy[k] = true
	}
	if !w.resetSeen {
		w.resetSeen = true
		// The core takes on the carried deltas never sent; a carried flush
		// that was sent is sent again unchanged, under its own life.
		for _, f := range w.startCarry {
			if f.Seq == 0 {
				c := w.truth().carried
				c.passes += f.StagePasses
				c.left += f.MessagesLeft
				for _, d := range f.Stages {
					addDelta(c.stage(d.Stage), d)
				}
			}
		}
	}
}

// txnModel is an outstanding queue transaction as the checker sees it.
type txnModel struct {
	ops   []int64 // its commands not yet answered
	items []int64 // the items of its resolve
	kinds []string
	// pends: the stages at which it may make rows pending that the core
	// could know of (a requeue, a move or a child that does not claim);
	// anywhere: it may make rows pending at any stage (a reset, a wake, a
	// release).
	pends    map[string]bool
	anywhere bool
}

// pendsOf fills in what a transaction of cmds may make pending (see txnModel).
func (t *txnModel) pendsOf(cmds []core.Command) {
	t.pends = map[string]bool{}
	for _, cmd := range cmds {
		switch x := cmd.(type) {
		case core.ResetOrphans, core.Wake, core.Release:
			t.anywhere = true
		case core.Resolve:
			for _, it := range x.Items {
				switch {
				case it.Verdict == core.Requeue:
					t.pends[it.Stage] = true
				case it.Verdict == core.Move && !it.Claim:
					t.pends[it.To] = true
				}
				for _, e := range it.Emits {
					if !e.Claim {
						t.pends[e.Stage] = true
					}
				}
			}
		}
	}
}

// txnOut reports whether a queue transaction is outstanding.
func (w *world) txnOut() bool { return len(w.txnsOut) > 0 }

// outstandingItems lists the items of the outstanding transactions' resolves.
func (w *world) outstandingItems() []int64 {
	var ids []int64
	for _, t := range w.txnsOut {
		ids = append(ids, t.items...)
	}
	return ids
}

// movesOutAt counts the moves and children of the outstanding resolves that
// claim at stage.
func (w *world) movesOutAt(stage string) int {
	n := 0
	for _, m := range w.movesOut {
		n += m[stage]
	}
	return n
}

// txnResult takes the result of the queue command op off its transaction.
func (w *world) txnResult(op int64, err string) {
	for i, t := range w.txnsOut {
		if j := slices.Index(t.ops, op); j >= 0 {
			w.txnsOut[i].ops = slices.Delete(t.ops, j, j+1)
			if len(w.txnsOut[i].ops) == 0 {
				w.txnsOut = slices.Delete(w.txnsOut, i, i+1)
			}
			break
		}
	}
	if err != "" {
		w.coreDown = true
	}
}

// queueAnswer records a line a worker wrote, to be matched with its delivery.
func (w *world) queueAnswer(id core.WorkerID, a answerInfo) {
	x := w.workers[id]
	x.answers = append(x.answers, a)
}

// answerEndsCooldown: an answer of x ends its stage's cooldown if x was
// spawned since it began (the program as started now works), or, for an
// older worker (perhaps the program before a deployment), once the cooldown
// has run out with no worker of the stage spawned since its last failed
// start still alive.
func (w *world) answerEndsCooldown(x *wmodel) bool {
	c := w.cool[x.stage]
	if !x.spawnAt.Before(c.from) {
		return true
	}
	if w.now.Before(c.until) {
		return false
	}
	return !slices.ContainsFunc(w.alive, func(y *wmodel) bool { return y.stage == x.stage && y.spawnAt.After(c.at) })
}

// coolDown is a failed start of a worker of stage s spawned at spawnAt: the
// cooldown doubles once per round of starts, however many workers of it
// failed and at whatever instants; a worker spawned before it last doubled
// is of that round, and holds the stage back as long again from now.
func (w *world) coolDown(s int, spawnAt time.Time) {
	c := &w.cool[s]
	if c.step > 0 && !spawnAt.After(c.at) {
		if until := w.now.Add(c.step); until.After(c.until) {
			c.until = until
		}
		return
	}
	c.from = spawnAt // a new round: only workers spawned since prove it over
	c.step = min(max(2*c.step, core.CooldownMin), core.CooldownMax)
	c.until, c.at = w.now.Add(c.step), w.now
}

func (w *world) modelAnswer(e core.Answer) {
	x := w.workers[e.Worker]
	if x == nil || x.gone || len(x.answers) == 0 {
		w.broke(ruleWorldConsistent, "answer from %s that the world did not write", e.Worker)
		return
	}
	a := x.answers[0]
	x.answers = x.answers[1:]
	if x.proto {
		return // the core ignores a worker after its protocol error
	}
	if e.Unterminated {
		x.tail = &a // how the worker ended decides (modelExit)
		return
	}
	if a.emit {
		w.modelEmit(x, a)
		return
	}
	if len(x.queue) == 0 || a.malformed {
		if len(x.queue) > 0 {
			w.modelPass(x, x.queue[0], a) // its emits die with the worker
		}
		// A line with nothing outstanding, or no status line, is a protocol
		// error: the core must kill the worker in this step, even if it had
		// already killed it for another reason: the line decides how its head
		// ends.
		x.proto = true
		if x.killed {
			x.cause = causeProtocol
		}
		return
	}
	stage := w.sc.stages[x.stage].name
	head := x.queue[0]
	x.queue = x.queue[1:]
	delete(w.holder, head)
	x.answered++
	w.answeredAt[x.stage] = w.now
	elapsed := w.now.Sub(x.headSince).Microseconds()
	x.headSince = w.now
	if len(x.queue) == 0 {
		x.idleSince = w.now
	}
	if w.answerEndsCooldown(x) {
		w.cool[x.stage] = cooldown{}
	}
	w.proveStage(x)
	delete(w.startFails, head)

	x.pass = ""
	badEmit, emits := w.modelPass(x, head, a)
	t := w.truth()
	var fusedUS int64
	for _, f := range a.fused {
		d := t.stage(f.Stage)
		d.Processed++
		d.ProcessingUS += f.Micros
		fusedUS += f.Micros
	}
	t.stage(stage).ProcessingUS += max(0, elapsed-fusedUS)
	t.passes += int64(len(a.fused)) + 1 // every answer ends a pass, whatever it says
	if badEmit {
		// An emit line it must refuse fails the message, whatever the answer.
		w.expects[head] = &expect{verdict: core.Fail, why: "an emit line the dispatcher must refuse", stage: stage, pass: x.pass}
		return
	}
	if !a.bad && (a.move != nil || a.code == 0) {
		t.stage(stage).Processed++
	}
	w.expects[head] = w.expectAnswer(x, head, a)
	w.expects[head].emits, w.expects[head].pass = emits, x.pass
	if !a.bad && a.move != nil {
		w.learnFeed(x.stage, a.move.To)
	}
}

// learnFeed records that a pass of stage s sent a message to stage to (a name,
// or a target that is no stage).
func (w *world) learnFeed(s int, to string) {
	t, ok := w.stageOf(to)
	if !ok || t == s || w.cfg.Stages[t].MaxPending <= 0 || slices.Contains(w.feeds[s], t) {
		return
	}
	w.feeds[s] = append(w.feeds[s], t)
}

// expectAnswer is how the core must resolve head, which worker x answered
// with a.
func (w *world) expectAnswer(x *wmodel, head int64, a answerInfo) *expect {
	stage := w.sc.stages[x.stage].name
	switch {
	case a.bad:
		// A transition the dispatcher cannot write fails the message.
		return &expect{verdict: core.Fail, why: "answered " + a.line, stage: stage}
	case a.move != nil:
		m := *a.move
		if m.To == core.TargetPaused {
			m.Until = w.now.Add(a.pauseFor)
		}
		return &expect{verdict: core.Move, why: "answered " + a.line, stage: stage, move: &m}
	case a.code == 0:
		return &expect{verdict: core.Answered, why: "answered 0", stage: stage, epoch: w.claimEpoch[head], answer: true}
	case a.code == core.RetryCode && w.cfg.Stages[x.stage].RetryLimit > 0:
		st := w.cfg.Stages[x.stage]
		attempts := w.claimAttempts[head]
		why := fmt.Sprintf("answered %s with %d retries had, RETRY_LIMIT %d", a.line, attempts, st.RetryLimit)
		if attempts >= st.RetryLimit {
			return &expect{verdict: core.Fail, why: why, stage: stage, reason: a.reason}
		}
		d := retryDelay(st.RetryDelay, st.RetryDelayMax, attempts)
		return &expect{verdict: core.Retry, why: why, stage: stage, reason: a.reason,
			retryFrom: w.now.Add(d), retryTo: w.now.Add(d + time.Duration(float64(d)*core.RetryJitter))}
	}
	return &expect{verdict: core.Fail, why: "answered " + a.line, stage: stage, reason: a.reason}
}

func (w *world) modelExit(e core.WorkerExited) {
	x := w.workers[e.Worker]
	if x == nil || x.gone {
		w.broke(ruleWorldConsistent, "exit of %s, which is not alive", e.Worker)
		return
	}
	if t := x.tail; t != nil {
		// A last line without a newline is an answer only if the worker
		// ended by itself: one the core killed, or a signal, may have cut
		// it off, and it is dropped.
		x.tail = nil
		if !x.killed && e.Signal == "" && e.Code == 0 {
			x.answers = append([]answerInfo{*t}, x.answers...)
			w.modelAnswer(core.Answer{Worker: e.Worker, Line: t.line})
			if x.proto {
				// The tail broke the protocol: the core killed it for that
				// (a Kill of a worker already gone), and its exit is judged
				// as a protocol error's.
				x.killed, x.cause = true, causeProtocol
			}
		}
	}
	w.bury(x)
	x.goneStep = w.steps
	q := x.queue
	x.queue = nil
	for _, id := range q {
		delete(w.holder, id)
	}
	stage := w.sc.stages[x.stage].name
	owe := func(ids []int64, verdict core.Verdict, why string) {
		for _, id := range ids {
			w.expects[id] = &expect{verdict: verdict, why: why, stage: stage}
		}
	}
	// A head's pass ends with its worker (stage_passes counts it); what
	// waited behind it had none.
	crashed := func(ids []int64, why string) {
		owe(ids, core.Fail, why)
		for _, id := range ids {
			w.expects[id].crash = true
			w.truth().passes++
			delete(w.startFails, id) // its pass ended: no run of failed starts goes on
		}
	}
	switch x.cause {
	case causeTimeout:
		if len(q) > 0 && q[0] == x.timedOut {
			owe(q[:1], core.TimeOut, "head of a worker the watchdog killed")
			w.truth().passes++
			delete(w.startFails, q[0]) // its pass ended: no run of failed starts goes on
			q = q[1:]
		}
		owe(q, core.Requeue, "behind the head of a worker the watchdog killed")
		return
	case causeProtocol:
		w.truth().stage(stage).Crashes++
		if len(q) > 0 {
			crashed(q[:1], "head of a worker that broke the protocol")
			q = q[1:]
		}
		owe(q, core.Requeue, "behind the head of a worker that broke the protocol")
		return
	case causeGrace, causeNow:
		owe(q, core.Requeue, "held by a worker killed while stopping")
		return
	}
	if x.stopped && len(q) == 0 && e.Code == 0 && e.Signal == "" {
		return // a clean stop
	}
	w.truth().stage(stage).Crashes++
	if x.answered == 0 && w.now.Sub(x.spawnAt) < core.StartWindow {
		w.coolDown(x.stage, x.spawnAt)
		if len(q) > 0 {
			f, ok := w.startFails[q[0]]
			if !ok {
				f.firstSpawn = x.spawnAt
			}
			f.n++
			w.startFails[q[0]] = f
			switch {
			case f.n < core.StartFailLimit:
			case !w.provenSpawn[x.stage].Before(f.firstSpawn):
				// A worker spawned since the first showed the program
				// starts: the message kills its workers.
				delete(w.startFails, q[0])
				crashed(q[:1], fmt.Sprintf("head of %d failed starts in a row, while the program could start", f.n))
				q = q[1:]
			default:
				// Nothing showed the program starts: a broken deployment
				// fails no message; the next workers are probes.
				if !w.probe[x.stage] {
					w.probe[x.stage], w.probeFrom[x.stage] = true, f.firstSpawn
				}
			}
		}
		owe(q, core.Requeue, "held by a worker that could not start")
		w.giveBackClaimed(x.stage)
		return
	}
	if len(q) > 0 {
		crashed(q[:1], "head of a crashed worker")
		owe(q[1:], core.Requeue, "behind the head of a crashed worker")
	}
}

// ---- what the core holds ----

// heldBy reports who in this life holds id: the backlog, a worker, or a resolve.
func (w *world) heldBy(id int64) (string, bool) {
	if s, ok := w.backlog[id]; ok {
		return "claimed for " + s, true
	}
	if wid, ok := w.holder[id]; ok {
		return "held by " + wid.String(), true
	}
	if ex, ok := w.expects[id]; ok {
		return "owed " + string(ex.verdict), true
	}
	return "", false
}

func (w *world) heldIDs() []int64 {
	var ids []int64
	ids = append(ids, sortedKeys(w.backlog)...)
	ids = append(ids, sortedKeys(w.holder)...)
	ids = append(ids, sortedKeys(w.expects)...)
	slices.Sort(ids)
	return ids
}

func (w *world) nothingHeld() bool {
	return len(w.backlog) == 0 && len(w.holder) == 0 && len(w.expects) == 0
}

func (w *world) heldText() string {
	var parts []string
	for _, id := range w.heldIDs() {
		why, _ := w.heldBy(id)
		parts = append(parts, fmt.Sprintf("%d %s", id, why))
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}

// heldAt counts the messages of stage the core has claimed and not yet taken back
// from a worker: its in-flight capacity.
func (w *world) heldAt(stage string) int {
	n := 0
	for _, s := range w.backlog {
		if s == stage {
			n++
		}
	}
	for _, y := range w.alive {
		if w.sc.stages[y.stage].name == stage {
			n += len(y.queue)
		}
	}
	return n
}

func (w *world) endLifeModel(exact bool) {
	t := w.truth()
	t.exact = exact
	if !exact {
		// Statistics carried into this life from lives that lost their lock
		// may be lost with it.
		for k := t.carriedFrom; k > 0; k = w.truths[k-1].carriedFrom {
			w.truths[k-1].exact = false
		}
	}
}

// ---- commands, recorded once the rules let them through ----

// recordCommand takes a command the rules let through into the ledger (and
// into the state the rules keep beside it): what the core now holds, hands
// out, stops, kills, claims, flushes and asks of the queue.
func (w *world) recordCommand(cmd core.Command) {
	switch x := cmd.(type) {
	case core.Release:
		w.releaseAsked[x.Op] = x.Named()
	case core.ResetOrphans:
		w.resetSent, w.resetOwed = true, false
	case core.Resolve:
		for _, it := range x.Items {
			if w.givesBack(it) {
				w.expects[it.ID] = &expect{verdict: core.Requeue, why: "claimed, not handed out, given back", stage: w.backlog[it.ID]}
				delete(w.backlog, it.ID)
			}
			if ex := w.expects[it.ID]; ex != nil {
				ex.sentOp, ex.claim, ex.sentReason, ex.keyBusyAt = x.Op, it.Claim, it.Reason, time.Time{}
				ex.sentStatus = ""
				switch it.Verdict {
				case core.Fail, core.Answered:
					ex.sentStatus = core.StatusFailed
				case core.TimeOut:
					ex.sentStatus = core.StatusTimeout
				}
				if w.movesOut[x.Op] == nil {
					w.movesOut[x.Op] = map[string]int{}
				}
				if it.Claim {
					w.movesOut[x.Op][it.To]++
				}
				for _, e := range it.Emits {
					if e.Claim {
						w.movesOut[x.Op][e.Stage]++ // a child inserted running there
					}
				}
			}
		}
	case core.Claim:
		w.recordClaim(x)
	case core.Busy:
		w.resting = false
	case core.Flush:
		w.recordFlush(x)
	case core.Inspect:
		w.inspectOut, w.inspectSent = true, w.now
		w.inspectCmdAt, w.settledAtInspect, w.baselineOwed = w.now, w.settledSeen, !w.claimSeen
	case core.Vacuum:
		w.vacuumOut, w.vacuumSent, w.vacuumedNow = true, w.now, true
	case core.Spawn:
		y := &wmodel{id: x.Worker, stage: w.stageIndex(x.Stage), spawnAt: w.now, idleSince: w.now}
		y.probe = w.probe[y.stage]
		w.workers[x.Worker] = y
		i, _ := slices.BinarySearchFunc(w.alive, y, func(a, b *wmodel) int { return int(a.id - b.id) })
		w.alive = slices.Insert(w.alive, i, y)
	case core.Write:
		w.recordWrite(x)
	case core.Stop:
		if y := w.workers[x.Worker]; !y.gone && !y.stopped && !y.killed {
			y.stopped, y.stoppedAt = true, w.now
		}
	case core.Kill:
		if y := w.workers[x.Worker]; !y.gone && !y.killed {
			y.killed, y.cause = true, w.killCauseOf(y)
			if y.cause == causeTimeout {
				y.timedOut = y.queue[0]
			}
		}
	}
}

// bury records that worker x is gone (it exited, or could not be spawned).
func (w *world) bury(x *wmodel) {
	x.gone = true
	w.alive = slices.DeleteFunc(w.alive, func(y *wmodel) bool { return y == x })
}

// recordClaim: the claim is outstanding with its caps; rows committed
// without a notification at its stages are the promptness rule's now; a
// stage with a RATE logs it.
func (w *world) recordClaim(x core.Claim) {
	w.claimCaps, w.toldInTxn = x.Caps, false
	w.limitsOut = x.Limits
	for _, id := range sortedKeys(w.unnotified) {
		r, _ := w.q.Get(id)
		for _, cp := range x.Caps {
			if cp.Stage == r.Stage {
				delete(w.unnotified, id)
			}
		}
	}
	for _, cp := range x.Caps {
		if s := w.stageIndex(cp.Stage); w.cfg.Stages[s].Rate > 0 {
			w.rateOut[s] = len(w.rateLog[s])
			w.rateLog[s] = append(w.rateLog[s], rateClaim{at: w.now, n: cp.N})
		}
	}
}

// recordFlush: a new flush of this life (not one re-sent under the same
// sequence, nor a carried one sent again) is the last, and what it carries is
// issued.
func (w *world) recordFlush(x core.Flush) {
	if last := w.lastFlush; x.Life != int64(w.life) || last != nil && x.Seq == last.Seq {
		return // a carried flush sent again, or one of this life's re-sent
	}
	w.flushedAt = w.now
	w.shutFlushed = w.shut > 0
	f := x
	w.lastFlush = &f
	w.issued.passes += x.StagePasses
	w.issued.left += x.MessagesLeft
	for _, d := range x.Stages {
		addDelta(w.issued.stage(d.Stage), d)
	}
}

// recordWrite: the ids leave the backlog for the worker's queue.
func (w *world) recordWrite(x core.Write) {
	y := w.workers[x.Worker]
	for _, id := range x.IDs {
		delete(w.backlog, id)
		w.holder[id] = x.Worker
	}
	if len(y.queue) == 0 {
		y.headSince = w.now
	}
	y.queue = append(y.queue, x.IDs...)
	y.handed += len(x.IDs)
}

// refusedFailure reports whether o is a row failed in place of an outcome
// the database refused (core.RefusedFallback's reason).
func refusedFailure(o core.Outcome) bool {
	return o.Status == core.StatusFailed && strings.Contains(o.Error, refusedReason)
}

// refusedReason is in the reason of every failure written in place of a
// refused outcome.
const refusedReason = "the database refused the write of this message's outcome"
