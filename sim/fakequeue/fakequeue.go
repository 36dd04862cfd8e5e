// Package fakequeue is an in-memory pepsi.queue that behaves, in every way the
// dispatcher core can observe, like the PostgreSQL queue of store: it
// passes the same conformance suite (internal/testenv/queuetest). It also models what
// a PostgreSQL crash does to stage programs' asynchronous commits: writes made by
// stages since the last dispatcher commit are lost and the crash sentinel is
// emptied. It is deterministic and single-threaded; it never reads the clock.
package fakequeue

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// Row is one message.
type Row struct {
	ID      int64
	Stage   string
	Status  core.RowStatus
	Timeout time.Time
	// PausedForGood marks a blocked row that was paused with no timeout
	// (never due): its release makes it paused again, not pending, as
	// PostgreSQL's keeps such a row's timeout as 'infinity' (schema 34).
	PausedForGood bool
	DispatchError string
	// State is the stages' part of state as compact JSON with sorted keys
	// ("" for {}); state.dispatch_error is DispatchError.
	State string
	// Attempts is the attempts column: retries at the current stage, 0 again on
	// every move to another stage the dispatcher writes.
	Attempts int
	// AttemptsStage is the attempts_stage column, "" for NULL: the stage of the
	// retry that added the last attempt (schema 27). A row a stage advanced
	// itself carries the attempts of the stage before until the dispatcher
	// makes it pending (the requeue) or claims it: those count them as 0 at a
	// stage other than this one (liveAttempts).
	AttemptsStage string
	// Payload is the payload column; NULL unless HasPayload.
	Payload    string
	HasPayload bool
	// DedupKey is the producer's idempotency key, "" if none.
	DedupKey string
	// Key is the order_key column, "" for NULL (orderkey.go).
	Key string
	// TraceParent is the traceparent column, "" for NULL; a claim gives a
	// row without one a fresh one (trace.go).
	TraceParent string
	// ParentID is the parent_id column, 0 for NULL: for a message a stage
	// emitted, the id of the message whose pass emitted it.
	ParentID int64
}

// StateJSON is the whole state column as JSON text with sorted keys, as a
// claim for an INPUT = message stage reads it: the stages' part and
// dispatch_error.
func (r Row) StateJSON() string {
	m := map[string]json.RawMessage{}
	if r.State != "" {
		if err := json.Unmarshal([]byte(r.State), &m); err != nil {
			panic(fmt.Sprintf("fakequeue: state %q: %v", r.State, err))
		}
	}
	if r.DispatchError != "" {
		b, _ := json.Marshal(r.DispatchError)
		m["dispatch_error"] = b
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("fakequeue: state: %v", err))
	}
	return string(b)
}

// message is what a claim for an INPUT = message stage reads of r: its state,
// and its payload unless it is longer than lineMax bytes.
func (r Row) message(lineMax int) *core.Message {
	m := &core.Message{State: r.StateJSON(), PayloadSize: -1, ParentID: r.ParentID}
	if r.HasPayload {
		m.PayloadSize = len(r.Payload)
		if len(r.Payload) <= lineMax {
			m.Payload = []byte(r.Payload)
		}
	}
	return m
}

// Queue is the fake queue. The zero value is not usable; call New.
type Queue struct {
	rows []*Row // rows[id-base-1] (slot); nil once purged
	// base is the last id handed out before this queue's first row
	// (StartAfter): a queue that lived before, whose ids are far past 1.
	base     int64
	epoch    string
	epochN   int
	flushSeq int64           // flushes applied, ever (dispatch_stats.flush_seq)
	marks    map[int64]int64 // per dispatcher life, the Seq of its last applied flush (stats_flushes)
	stats    map[string]core.StageDelta
	// statsAt is when a flush last touched each stage's statistics, and
	// (at "") the dispatcher's own: updated_at (see Clock).
	statsAt map[string]time.Time
	// health is pepsi.stage_health, by stage.
	health map[string]store.StageHealth
	passes int64
	left   int64
	// history is pepsi.history's rows in the order written, days its
	// partitions (history.go).
	history []store.HistoryRow
	// refuseKey is the state key RefuseStateKey refuses ("" for none).
	refuseKey string
	days      map[time.Time]bool
	// undo holds the before-images of stage writes not yet made durable by a
	// dispatcher commit, newest last.
	undo []Row
	// inFlight counts producer transactions between Reserve and Commit or
	// Abort: ids taken, rows not yet there.
	inFlight int
	// keyLocks: the keys whose lock a producer in flight holds, with its
	// reserved id; keyed: what each such producer's insert decided
	// (orderkey.go).
	keyLocks map[string]int64
	keyed    map[int64]keyed
	// Notified counts NOTIFY ingress sent (inserts and wakes).
	Notified int
	// racing holds the commits that land during the next resolve of a row
	// (CommitDuringResolve).
	racing map[int64]func()
	// updated is each row's updated_at (see Clock), kept beside Row so that
	// rows compare by what the dispatcher and the stages wrote.
	updated map[int64]time.Time
	// created is each row's created_at (see Clock), set when it is inserted.
	created map[int64]time.Time
	// versions is each row's version (see StageRow.Version): a count of its
	// changes.
	versions map[int64]uint32
	// Dead counts the dead row versions left behind: one per change of a row,
	// until Vacuum.
	Dead int64
	// Notify, if set, is called for every NOTIFY ingress the queue sends (an
	// insert, or a wake that made rows pending), so a simulator can deliver it to
	// the dispatcher, late or not at all. It runs inside Insert or Exec.
	Notify func()
	// Clock, if set, is the database server's clock, for what a statement
	// stamps with now() (a row's created_at and updated_at, a retry's
	// retried_at) and what it compares with now() (a purge's cutoff, a
	// selection's OlderThan: read once per statement, as now() is one
	// instant). Without it every stamp is the zero time.
	// The fake never reads the real clock.
	Clock func() time.Time
	// Observe, if set, is called for every change of a row, with the row before and
	// after and who wrote it, so a simulator can check who moves what.
	Observe func(Change)
	// Inserted, if set, is called for every child a resolve inserts (a
	// message a stage emitted), as it is inserted.
	Inserted func(Row)
}

// Writer names who changed a row: a dispatcher command, a stage program, or a
// PostgreSQL crash that lost a stage's write.
type Writer string

// The writers of row changes.
const (
	ByClaim   Writer = "claim"
	ByResolve Writer = "resolve"
	ByWake    Writer = "wake"
	ByReset   Writer = "reset-orphans"
	ByStage   Writer = "stage"
	ByCrash   Writer = "crash"
	// ByOperator is a tool such as pepsi-queue retry.
	ByOperator Writer = "operator"
	// ByStray is a mistaken tool that breaks the rules of who writes what
	// (Stray): a fault the dispatcher must recover from, not one it makes.
	ByStray Writer = "stray tool"
)

// Change is one change of one row.
type Change struct {
	By     Writer
	Before Row
	After  Row
}

// New returns an empty queue.
func New() *Queue {
	return &Queue{stats: map[string]core.StageDelta{}, statsAt: map[string]time.Time{}, marks: map[int64]int64{}}
}

// StartAfter makes the empty queue's ids start after base, as a queue whose
// identity handed out base ids before (rows since purged) does: the core
// must not take those ids for growth it saw (core.InspectGrowth). It panics
// on a queue that has rows.
func (q *Queue) StartAfter(base int64) {
	if len(q.rows) > 0 || base < 0 {
		panic(fmt.Sprintf("fakequeue: StartAfter(%d) on a queue of %d rows", base, len(q.rows)))
	}
	q.base = base
}

// slot is row id's index in rows; nextID the id the next row gets.
func (q *Queue) slot(id int64) int { return int(id - q.base - 1) }
func (q *Queue) nextID() int64     { return q.base + int64(len(q.rows)) + 1 }

// Insert adds n pending rows at stage in one producer transaction and returns
// their ids.
func (q *Queue) Insert(stage string, n int) []int64 {
	ids := make([]int64, n)
	for i := range ids {
		id := q.nextID()
		q.rows = append(q.rows, &Row{ID: id, Stage: stage, Status: core.StatusPending})
		q.touch(id)
		ids[i] = id
	}
	if n > 0 {
		q.notify()
	}
	return ids
}

// InsertMessage adds one pending row at stage with state (a JSON object, ""
// for {}) and payload (nil for NULL), in one producer transaction, and returns
// its id.
func (q *Queue) InsertMessage(stage, state string, payload []byte) int64 {
	id := q.add(stage, state, payload, "", "", time.Time{})
	q.notify()
	return id
}

// Size is how many rows the queue holds, finished ones included, and those of
// producers in flight.
func (q *Queue) Size() int64 { return int64(len(q.rows)) }

// Reserve starts a producer transaction that inserts one row: the row's id is
// taken now, as PostgreSQL's identity does at insert, but the row appears only
// at Commit (or never, after Abort). Meanwhile claims report nothing settled.
func (q *Queue) Reserve() int64 {
	id := q.nextID()
	q.rows = append(q.rows, nil)
	q.inFlight++
	return id
}

// Commit ends the producer transaction of a reserved id: its row appears,
// pending at stage, and the queue notifies.
func (q *Queue) Commit(id int64, stage string) {
	q.commit(id, stage, time.Time{})
}

// schedule applies a new row's not_before (zero for none), as the insert
// does once the trigger has decided whether the row is blocked: a time ahead
// of the clock (see Clock) pauses a pending row until then, and a blocked
// row keeps it for when it becomes its key's head.
func (q *Queue) schedule(r *Row, notBefore time.Time) {
	if notBefore.After(q.now()) {
		r.Timeout = notBefore
		if r.Status == core.StatusPending {
			r.Status = core.StatusPaused
		}
	}
}

// commit is Commit of a row scheduled until notBefore (zero for none): paused
// until then if it is ahead of the clock (see Clock), as an insert with
// not_before does; a blocked keyed row keeps the time for when it becomes its
// key's head.
func (q *Queue) commit(id int64, stage string, notBefore time.Time) {
	r := &Row{ID: id, Stage: stage, Status: core.StatusPending}
	q.rows[q.slot(id)] = r
	q.commitKeyed(r)
	q.schedule(r, notBefore)
	q.touch(id)
	q.inFlight--
	q.notify()
}

// CommitMessage is Commit for a row with a payload (nil for NULL), scheduled
// until notBefore (zero for none: see commit).
func (q *Queue) CommitMessage(id int64, stage string, payload []byte, notBefore time.Time) {
	q.commit(id, stage, notBefore)
	if payload != nil {
		q.rows[q.slot(id)].Payload, q.rows[q.slot(id)].HasPayload = string(payload), true
	}
}

// Abort ends the producer transaction of a reserved id without its row.
func (q *Queue) Abort(id int64) {
	q.abortKeyed(id)
	q.inFlight--
}

// RetryAll is pepsi-queue retry -all of every failed or timed-out row that
// skip does not exclude, followed by its NOTIFY (always, as pepsi-queue retry
// does). It returns their ids.
func (q *Queue) RetryAll(skip func(id int64) bool) []int64 {
	var ids []int64
	var keys []string
	for _, r := range q.rows {
		if r != nil && (r.Status == core.StatusFailed || r.Status == core.StatusTimeout) && !skip(r.ID) &&
			(r.Key == "" || !q.KeyLocked(r.Key)) { // (the tool would wait for the producer: see release)
			q.retry(r, "")
			ids = append(ids, r.ID)
			keys = append(keys, r.Key)
		}
	}
	q.release(keys, true, ByOperator)
	if len(ids) > 0 {
		// The tool commits synchronously, as in Retry.
		q.undo = nil
		q.notify()
	}
	return ids
}

// Unpause is an operator's own SQL for a message a stage paused for years
// (pepsi-queue retry leaves paused rows to the dispatcher): status back to
// pending at its stage, no timeout, and NOTIFY ingress, as docs/protocol.md
// asks of any tool that makes a row pending. It reports false, and changes
// nothing, when the row is not paused.
func (q *Queue) Unpause(id int64) bool {
	r := q.row(id)
	if r == nil || r.Status != core.StatusPaused {
		return false
	}
	before := *r
	r.Status, r.Timeout = core.StatusPending, time.Time{}
	q.observe(ByOperator, before, r)
	q.undo = nil // the tool commits synchronously, as in Retry
	q.notify()
	return true
}

// Stray is a mistaken tool's UPDATE (an operator's hand-written SQL, a script
// of another system): the lowest pending row that skip does not exclude
// becomes running, with no NOTIFY and no worker that holds it. It returns the
// row's id, 0 if there is none. Only the heartbeat's sweep can make such a
// row pending again.
func (q *Queue) Stray(skip func(id int64) bool) int64 {
	for _, r := range q.rows {
		if r != nil && r.Status == core.StatusPending && !skip(r.ID) {
			before := *r
			r.Status = core.StatusRunning
			q.observe(ByStray, before, r)
			q.undo = nil // the tool commits synchronously, as in Retry
			return r.ID
		}
	}
	return 0
}

// settled is Claimed.Settled: the newest row's id, if no producer is
// mid-transaction or it is at or below known (core.Claim.Settled).
func (q *Queue) settled(known int64) int64 {
	var newest int64
	for i := len(q.rows) - 1; i >= 0; i-- {
		if q.rows[i] != nil {
			newest = q.rows[i].ID
			break
		}
	}
	if q.inFlight > 0 && newest > known {
		return 0
	}
	return newest
}

func (q *Queue) notify() {
	q.Notified++
	if q.Notify != nil {
		q.Notify()
	}
}

// observe reports a change of r from before, if anything changed.
func (q *Queue) observe(by Writer, before Row, r *Row) {
	if before != *r {
		q.Dead++
		q.touch(r.ID)
	}
	if q.Observe != nil && before != *r {
		q.Observe(Change{By: by, Before: before, After: *r})
	}
}

// touch sets a row's updated_at to now (see Clock), and its created_at when
// the row is new, and counts a new version of it.
func (q *Queue) touch(id int64) {
	if q.updated == nil {
		q.updated, q.created, q.versions = map[int64]time.Time{}, map[int64]time.Time{}, map[int64]uint32{}
	}
	q.versions[id]++
	now := q.now()
	q.updated[id] = now
	if _, ok := q.created[id]; !ok {
		q.created[id] = now
	}
}

// Vacuum removes the dead row versions.
func (q *Queue) Vacuum() { q.Dead = 0 }

// Get returns a copy of row id, or false.
func (q *Queue) Get(id int64) (Row, bool) {
	r := q.row(id)
	if r == nil {
		return Row{}, false
	}
	return *r, true
}

// Rows returns copies of every row in id order.
func (q *Queue) Rows() []Row {
	out := make([]Row, 0, len(q.rows))
	for _, r := range q.rows {
		if r != nil {
			out = append(out, *r)
		}
	}
	return out
}

func (q *Queue) row(id int64) *Row {
	if i := q.slot(id); i >= 0 && i < len(q.rows) {
		return q.rows[i]
	}
	return nil
}

// CommitDuringResolve makes commit (a stage's write, such as StageWrite) land
// while the next transaction's resolve of row id waits on the row: the resolve
// applies its item to the committed row if that is still running at the stage
// it read, and otherwise writes nothing and reports the row as it read it
// (running), as PostgreSQL's UPDATE under READ COMMITTED does. If the next
// transaction does not resolve the row, the commit lands before it; a Crash
// loses it.
func (q *Queue) CommitDuringResolve(id int64, commit func()) {
	if q.racing == nil {
		q.racing = map[int64]func(){}
	}
	q.racing[id] = commit
}

// Crash models a PostgreSQL crash: stage writes since the last dispatcher commit
// are lost and the crash sentinel is emptied.
func (q *Queue) Crash() {
	for i := len(q.undo) - 1; i >= 0; i-- {
		r := q.rows[q.slot(q.undo[i].ID)]
		was := *r
		*r = q.undo[i]
		q.observe(ByCrash, was, r)
	}
	q.undo = nil
	q.racing = nil // uncommitted transactions die with the server
	q.epoch = ""
}

// ClearEpoch empties the crash sentinel only.
func (q *Queue) ClearEpoch() { q.epoch = "" }

// FlushMark returns the Seq of the last flush of life applied, 0 if none.
func (q *Queue) FlushMark(life int64) int64 { return q.marks[life] }

// Stats returns the statistics tables; flushSeq counts the flushes applied.
func (q *Queue) Stats() (stages map[string]core.StageDelta, passes, left, flushSeq int64) {
	out := make(map[string]core.StageDelta, len(q.stats))
	for k, v := range q.stats {
		out[k] = v
	}
	return out, q.passes, q.left, q.flushSeq
}

// Exec runs the commands of one step atomically and returns their results; as a
// dispatcher commit, it makes every earlier stage write durable.
func (q *Queue) Exec(_ context.Context, cmds []core.Command) []core.Event {
	q.undo = nil
	// A commit waiting for a resolve that is not in this transaction lands now.
	for _, id := range slices.Sorted(maps.Keys(q.racing)) {
		if !resolves(cmds, id) {
			commit := q.racing[id]
			delete(q.racing, id)
			commit()
		}
	}
	if id, ok := q.refusedWhole(cmds); ok {
		// Even the failure of message id would be refused: PostgreSQL
		// refuses the transaction, and the store finds nothing to narrow.
		return Aborted(cmds, fmt.Sprintf("resolve: message %d: %s", id, q.refusal()))
	}
	out := make([]core.Event, 0, len(cmds))
	for _, cmd := range cmds {
		out = append(out, q.apply(cmd))
	}
	// The stage commits that landed before or during this transaction (the
	// racing ones above and in its resolve) are in the WAL before its commit
	// record, which the dispatcher's synchronous commit flushes: durable too.
	// (Left in undo, a crash would undo them after this transaction's writes
	// built on them: seed 199419413923296 saw a reset's pending row become
	// running again.)
	q.undo = nil
	return out
}

// keyBusy reports whether item it, of row r, is a move whose guard holds
// and some of whose children's order keys a producer in flight holds:
// PostgreSQL's resolve writes nothing of it (core.Outcome.KeyBusy).
func (q *Queue) keyBusy(it core.Item, r *Row) bool {
	return it.Verdict == core.Move && r.Status == core.StatusRunning && r.Stage == it.Stage && q.orderKeysFree(emitKeys(it)) != nil
}

// emitKeys lists the order keys of the emits of item it.
func emitKeys(it core.Item) []string {
	var keys []string
	for _, e := range it.Emits {
		keys = append(keys, e.OrderKey)
	}
	return keys
}

// insertChildren inserts the children of a move whose guard matched, as
// resolveSQL does: pending at their stages (blocked behind their order key
// as any insert), or running there for an emit that claims (core.Emit.Claim)
// when the pass has a trace context to give it, parent_id the moved row's
// id, in order; a child whose key a row holds already inserts nothing; each
// child's traceparent is trace, the emitting pass's. It returns the children
// inserted running, read as a claim reads them (traces: with all its
// traces). No NOTIFY: the dispatcher that wrote them learns of them from the
// outcome.
func (q *Queue) insertChildren(parent int64, trace string, emits []core.Emit, traces bool) []core.Child {
	var running []core.Child
	for _, e := range emits {
		if e.Key != "" && q.holder(e.Key) != 0 {
			continue
		}
		id := q.add(e.Stage, e.State, e.Payload, e.Key, e.OrderKey, time.Time{})
		r := q.rows[q.slot(id)]
		r.ParentID, r.TraceParent = parent, trace
		if e.Claim && e.Key == "" && e.OrderKey == "" && trace != "" && r.Status == core.StatusPending {
			r.Status = core.StatusRunning
			running = append(running, core.Child{ID: r.ID, Stage: r.Stage, Trace: q.trace(r, traces, false)})
		}
		if q.Inserted != nil {
			q.Inserted(*r)
		}
	}
	return running
}

// resolves reports whether cmds resolve row id.
func resolves(cmds []core.Command, id int64) bool {
	for _, cmd := range cmds {
		if r, ok := cmd.(core.Resolve); ok && slices.ContainsFunc(r.Items, func(it core.Item) bool { return it.ID == id }) {
			return true
		}
	}
	return false
}

// Failed returns the results cmds get when their transaction fails with err,
// and may or may not have committed.
func Failed(cmds []core.Command, err string) []core.Event { return failed(cmds, err, false) }

// Aborted returns the results cmds get when their transaction fails with err
// and the shell knows it did not commit (core.Claimed.Aborted).
func Aborted(cmds []core.Command, err string) []core.Event { return failed(cmds, err, true) }

func failed(cmds []core.Command, err string, aborted bool) []core.Event {
	out := make([]core.Event, 0, len(cmds))
	for _, cmd := range cmds {
		switch c := cmd.(type) {
		case core.ResetOrphans:
			out = append(out, core.OrphansReset{Op: c.Op, Err: err})
		case core.Resolve:
			out = append(out, core.Resolved{Op: c.Op, Err: err, Aborted: aborted})
		case core.Wake:
			out = append(out, core.Woken{Op: c.Op, Err: err})
		case core.Release:
			out = append(out, core.Released{Op: c.Op, Err: err})
		case core.Claim:
			out = append(out, core.Claimed{Op: c.Op, Err: err, Aborted: aborted})
		case core.Flush:
			out = append(out, core.Flushed{Op: c.Op, Err: err})
		case core.KeepHistory:
			out = append(out, core.HistoryKept{Op: c.Op, Err: err})
		default:
			panic(fmt.Sprintf("fakequeue: %T is not a queue command", cmd))
		}
	}
	return out
}

// write applies an item's verdict to a row still running at the item's stage.
func (q *Queue) write(r *Row, it core.Item) {
	switch it.Verdict {
	case core.Requeue:
		r.Status = core.StatusPending
	case core.Fail:
		r.Status, r.DispatchError = core.StatusFailed, it.Reason
	case core.TimeOut:
		r.Status, r.DispatchError = core.StatusTimeout, it.Reason
	case core.Answered:
		if it.Epoch != "" && it.Epoch != q.epoch {
			r.Status = core.StatusPending // a crash may have lost the stage's own commit
			return
		}
		r.Status, r.DispatchError = core.StatusFailed, it.Reason
	case core.Retry:
		r.Status, r.Timeout, r.DispatchError = core.StatusPaused, it.Until, it.Reason
		r.Attempts++
		r.AttemptsStage = r.Stage
	case core.Move:
		switch it.To {
		case core.TargetDone:
			r.Status = core.StatusDone
		case core.TargetPaused:
			r.Status, r.Timeout = core.StatusPaused, it.Until
		default:
			if it.To != r.Stage {
				r.Attempts = 0
			}
			r.Stage, r.Status = it.To, core.StatusPending
			if it.Claim && !q.behindKey(r) {
				r.Status = core.StatusRunning // a move that claims
			}
		}
		if it.Patch != "" {
			r.State = merge(r.State, it.Patch)
		}
	default:
		panic(fmt.Sprintf("fakequeue: item %v has no verdict it knows", it))
	}
}

// liveAttempts is r's attempts as the claim and the orphan reset write them:
// 0 when they were counted at another stage than r's (a stage advanced it
// itself, and the dispatcher that would have set them to 0 died first).
func liveAttempts(r *Row) int {
	if r.AttemptsStage != "" && r.AttemptsStage != r.Stage {
		return 0
	}
	return r.Attempts
}

// merge is jsonb's "state || patch" for two objects: the patch's top-level keys
// replace the state's. Both are valid JSON objects (the core checks patches).
func merge(state, patch string) string {
	m := map[string]json.RawMessage{}
	if state != "" {
		if err := json.Unmarshal([]byte(state), &m); err != nil {
			panic(fmt.Sprintf("fakequeue: state %q: %v", state, err))
		}
	}
	var p map[string]json.RawMessage
	if err := json.Unmarshal([]byte(patch), &p); err != nil {
		panic(fmt.Sprintf("fakequeue: patch %q: %v", patch, err))
	}
	maps.Copy(m, p)
	b, err := json.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("fakequeue: state: %v", err))
	}
	return string(b)
}

func (q *Queue) apply(cmd core.Command) core.Event {
	switch c := cmd.(type) {
	case core.ResetOrphans:
		return q.reset(c)
	case core.Claim:
		return q.claim(c)
	case core.Resolve:
		return q.resolve(c)
	case core.Wake:
		return q.wake(c)
	case core.Release:
		return q.releaseCmd(c)
	case core.Flush:
		return q.flush(c)
	case core.KeepHistory:
		return q.keepHistory(c)
	}
	panic(fmt.Sprintf("fakequeue: %T is not a queue command", cmd))
}

// reset makes every running row not kept pending.
func (q *Queue) reset(c core.ResetOrphans) core.Event {
	n := 0
	var keys []string
	for _, r := range q.rows {
		if r != nil && r.Status == core.StatusRunning && !slices.Contains(c.Keep, r.ID) {
			before := *r
			r.Status, r.Attempts = core.StatusPending, liveAttempts(r)
			q.observe(ByReset, before, r)
			q.record(store.HistoryRow{ID: r.ID, Stage: r.Stage, Event: core.HistoryReset, At: c.Now, Attempts: r.Attempts})
			n++
			if r.Key != "" {
				keys = append(keys, r.Key)
			}
		}
	}
	slices.Sort(keys)
	ev := core.OrphansReset{Op: c.Op, Count: n, Keys: slices.Compact(keys)}
	if c.ReleaseKeys {
		ev.Heads, ev.Busy = q.release(q.blockedKeys(), false, ByRelease)
		if len(q.keyLocks) > 0 { // a keyed producer in flight (see core.OrphansReset.Seq)
			ev.Seq = q.nextID() - 1 // ids handed out, rows of producers in flight included
		}
	}
	return ev
}

// claim takes up to each cap's N pending rows of its stage above its floor,
// the excluded ones aside (none for a stage its holds hold, as the limits
// stand before it), and names the stages where one more was there; then it
// names the stages of its limits with more than their Max pending.
func (q *Queue) claim(c core.Claim) core.Event {
	if q.epoch == "" {
		q.epochN++
		q.epoch = fmt.Sprintf("e%d", q.epochN)
	}
	var rows []core.Row
	var more []string
	before := q.over(c.Limits)
	for _, cp := range c.Caps {
		if held(cp.Stage, c.Holds, before) {
			cp.N = 0 // held by a stage its transaction took over its limit
		}
		n := 0
		for _, r := range q.rows {
			if r != nil && r.Status == core.StatusPending && r.Stage == cp.Stage && r.ID > cp.After && !slices.Contains(c.Exclude, r.ID) && q.claimable(r, c.ExcludeKeys) {
				if n >= cp.N {
					more = append(more, cp.Stage) // one row past the cap: the stage has more
					break
				}
				before := *r
				r.Status, r.Attempts = core.StatusRunning, liveAttempts(r)
				q.claimTrace(r)
				q.observe(ByClaim, before, r)
				row := core.Row{ID: r.ID, Stage: r.Stage, Attempts: r.Attempts, Key: r.Key}
				if cp.LineMax > 0 {
					row.Message = r.message(cp.LineMax)
				}
				row.Trace = q.trace(r, c.Traces, cp.LineMax > 0)
				rows = append(rows, row)
				n++
			}
		}
	}
	slices.SortFunc(rows, func(a, b core.Row) int { return int(a.ID - b.ID) })
	slices.Sort(more)
	return core.Claimed{Op: c.Op, Epoch: q.epoch, Rows: rows, Settled: q.settled(c.Settled), More: more, Over: q.over(c.Limits)}
}

// held reports whether stage feeds a stage of over (holds) and is not in over
// itself.
func held(stage string, holds []core.Hold, over []string) bool {
	if slices.Contains(over, stage) {
		return false
	}
	return slices.ContainsFunc(holds, func(h core.Hold) bool { return h.Stage == stage && slices.Contains(over, h.By) })
}

// over names the stages of limits with more than their Max rows pending
// above their After, in the order of limits.
func (q *Queue) over(limits []core.Limit) []string {
	var out []string
	for _, l := range limits {
		n := int64(0)
		for _, r := range q.rows {
			if r != nil && r.Status == core.StatusPending && r.Stage == l.Stage && r.ID > l.After {
				n++
			}
		}
		if n > l.Max {
			out = append(out, l.Stage)
		}
	}
	return out
}

// resolve writes each item under its guard (status running at the item's
// stage), reporting every row as it is after, or as a racing commit left it.
// A move with Claim that matches writes the row running at its target and
// reports it as a claim would (its attempts, and its message with LineMax),
// unless an older message of its key is unfinished: then it is pending there.
func (q *Queue) resolve(c core.Resolve) core.Event {
	out := make([]core.Outcome, 0, len(c.Items))
	for _, it := range c.Items {
		r := q.row(it.ID)
		if r == nil {
			out = append(out, core.Outcome{ID: it.ID})
			continue
		}
		if q.keyBusy(it, r) {
			// Its children's insert would wait for a producer: the
			// statement writes nothing of the item, before it would wait
			// on the row for a racing commit (core.Outcome.KeyBusy).
			out = append(out, core.Outcome{ID: r.ID, Stage: r.Stage, Status: r.Status, Error: r.DispatchError, KeyBusy: true})
			continue
		}
		wrote := false
		var children []core.Child
		if commit := q.racing[it.ID]; commit != nil {
			// The statement read the row, then waited for a stage's commit
			// on it; if that moved the row off what the statement saw, the
			// UPDATE skips it and the row is reported as it was read.
			delete(q.racing, it.ID)
			seen := *r
			commit()
			if seen.Status == core.StatusRunning && (r.Status != seen.Status || r.Stage != seen.Stage) {
				o := core.Outcome{ID: seen.ID, Stage: seen.Stage, Status: seen.Status, Error: seen.DispatchError}
				out = append(out, o)
				continue
			}
		}
		matched := r.Status == core.StatusRunning && r.Stage == it.Stage
		var refusal string
		if matched && it.Verdict == core.Move && it.Patch != "" && q.refuses(merge(r.State, it.Patch)) {
			// store.Queue.Exec narrows the refused transaction down to
			// this item and writes its failure instead.
			refusal = q.refusal()
			it = core.RefusedFallback(it, refusal)
		}
		if r.Status == core.StatusRunning {
			wrote = true
			before := *r
			pass := q.passTrace(r) // the emitting pass's, before the write changes the row's version
			if matched {
				q.write(r, it)
				if it.Claim {
					q.claimTrace(r)
				}
			} else {
				// Advanced by its stage: requeued there, with no retries yet.
				r.Status, r.Attempts = core.StatusPending, 0
			}
			q.observe(ByResolve, before, r)
			if matched && it.Verdict == core.Move {
				children = q.insertChildren(r.ID, pass, it.Emits, c.Traces) // (after the parent's change is observed)
			}
		}
		q.recordPass(it, wrote, matched, r)
		o := core.Outcome{ID: r.ID, Stage: r.Stage, Status: r.Status, Error: r.DispatchError, Matched: matched, Children: children, Refused: refusal}
		if r.Status == core.StatusPaused {
			o.Timeout = r.Timeout
		}
		if matched && it.Claim && r.Status == core.StatusRunning {
			// Moved and claimed: read as a claim reads the row.
			o.Attempts = r.Attempts
			if it.LineMax > 0 {
				o.Message = r.message(it.LineMax)
			}
			o.Trace = q.trace(r, c.Traces, it.LineMax > 0)
		}
		out = append(out, o)
	}
	return core.Resolved{Op: c.Op, Outcomes: out}
}

// wake makes the paused rows due by c.Now pending, the kept ones aside.
func (q *Queue) wake(c core.Wake) core.Event {
	var due []*Row
	var next time.Time
	for _, r := range q.rows {
		// A row paused with no due time (a NULL timeout) is never due, as
		// "timeout <= now" is never true of NULL in PostgreSQL.
		if r == nil || r.Status != core.StatusPaused || r.Timeout.IsZero() || slices.Contains(c.Keep, r.ID) {
			continue
		}
		if !r.Timeout.After(c.Now) {
			due = append(due, r)
		} else if next.IsZero() || r.Timeout.Before(next) {
			next = r.Timeout
		}
	}
	// The first core.WakeMax due, as PostgreSQL's ORDER BY timeout LIMIT
	// takes them (its order among equal timeouts is its own; the suite
	// promises none).
	slices.SortStableFunc(due, func(a, b *Row) int { return a.Timeout.Compare(b.Timeout) })
	if len(due) >= core.WakeMax {
		due, next = due[:core.WakeMax], c.Now
	}
	for _, r := range due {
		before := *r
		r.Status = core.StatusPending
		r.Timeout = time.Time{}
		if r.Attempts > 0 {
			r.DispatchError = "" // the reason of the retry it waited out
		}
		q.observe(ByWake, before, r)
		q.record(store.HistoryRow{ID: r.ID, Stage: r.Stage, Event: core.HistoryWoken, At: c.Now, Attempts: r.Attempts})
	}
	if len(due) > 0 {
		q.notify()
	}
	return core.Woken{Op: c.Op, Count: len(due), Next: next}
}

// flush applies a statistics flush once per (life, seq).
func (q *Queue) flush(c core.Flush) core.Event {
	if c.Seq > q.marks[c.Life] {
		q.marks[c.Life] = c.Seq
		q.flushSeq++
		q.passes += c.StagePasses
		q.left += c.MessagesLeft
		now := q.now()
		q.statsAt[""] = now
		for _, d := range c.Stages {
			q.statsAt[d.Stage] = now
			s := q.stats[d.Stage]
			s.Stage = d.Stage
			s.Add(d)
			q.stats[d.Stage] = s
		}
	}
	return core.Flushed{Op: c.Op}
}
