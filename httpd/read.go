// Package httpd is pepsi-httpd's web side: it reads what an operator wants to
// know about a PEPSI pipeline from PostgreSQL (live queue depths, the statistics
// pepsi-dispatch flushes, whether a dispatcher holds the lock, the latest
// failures) and serves it as Prometheus metrics at /metrics, as JSON at
// /api/status, as a live page at / and as a health check at /healthz.
//
// It must never write to the database itself (it works with a read-only role
// and every transaction it opens is READ ONLY; the page's actions, with
// ACTIONS = on, are the Actor's that the program gives it: actions.go), never
// read or show a message's payload,
// and never run a query whose cost grows with the finished messages kept in the
// queue: every query walks one of the queue's partial indexes (see sql.go and
// the EXPLAIN test). Scrapes that arrive together share one read.
package httpd

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// Statuses lists the statuses the live gauges count, in pipeline order. Done
// messages are not counted: they are most of the table and counting them would
// scan it; pepsi_dispatch_messages_left_total says how many left.
var Statuses = slices.DeleteFunc(core.RowStatuses(), func(s core.RowStatus) bool { return s == core.StatusDone })

// StageStats is one row of pepsi.stage_stats, under names that say what each
// number counts (see docs/pepsi-httpd.8.md "Metrics").
type StageStats struct {
	Stage string `json:"stage"`
	// PassesOK is the column processed: stage passes whose worker answered 0,
	// fused passes included. A message the stage itself finished as failed
	// (stage.Failed, state.error) was answered 0 and counts here.
	PassesOK int64 `json:"passes_ok"`
	// FailedByDispatcher is the column failed: messages the dispatcher failed
	// (a non-zero answer, a worker crash, a protocol error; state.dispatch_error).
	FailedByDispatcher int64 `json:"failed_by_dispatcher"`
	// WatchdogTimeouts is the column timeouts: messages the MAX_RUNTIME watchdog
	// timed out (their worker killed).
	WatchdogTimeouts int64 `json:"watchdog_timeouts"`
	// WorkerCrashes is the column crashes: worker processes that died unexpectedly.
	WorkerCrashes int64 `json:"worker_crashes"`
	// ProcessingSeconds is processing_us in seconds: the time of the passes counted.
	ProcessingSeconds float64 `json:"processing_seconds"`
	// Retries is the column retries: messages paused for a retry (answer 75).
	Retries int64 `json:"retries"`
	// RateHeldSeconds is rate_held_us in seconds: how long the stage had work
	// it could have claimed but its RATE had no token for it.
	RateHeldSeconds float64 `json:"rate_held_seconds"`
	// Emitted is the column emitted: messages the stage's passes emitted,
	// whose transition was written.
	Emitted int64 `json:"emitted"`
	// EmitsDropped is the column emits_dropped: emitted messages that inserted
	// nothing, their pass having written no transition.
	EmitsDropped int64 `json:"emits_dropped"`
	// GuardMisses is the column guard_misses: outcomes the dispatcher could
	// not write because the row was no longer running at the stage.
	GuardMisses int64 `json:"guard_misses"`
	// FlushedAt is when a flush of the dispatcher last touched the row.
	FlushedAt time.Time `json:"flushed_at"`
}

// StageLive is what the queue holds for one stage right now.
type StageLive struct {
	Stage string `json:"stage"`
	// Messages counts the stage's rows per status in Statuses.
	Messages map[core.RowStatus]int64 `json:"messages"`
	// OldestPendingSeconds is how long the stage's longest-waiting pending
	// message has been ready (pepsi-queue stats' oldest pending); 0 with none.
	OldestPendingSeconds float64 `json:"oldest_pending_seconds"`
	// PausedDue counts paused rows whose timeout has passed (the dispatcher has
	// not woken them yet; many for long means it is not running).
	PausedDue int64 `json:"paused_due"`
	// RetryWaiting counts paused rows with attempts > 0: messages waiting out
	// a retry (answer 75).
	RetryWaiting int64 `json:"retry_waiting"`
}

// Failure is one message that left the pipeline failed or timed out. It never
// carries the payload.
type Failure struct {
	ID        int64     `json:"id"`
	Stage     string    `json:"stage"`
	Status    string    `json:"status"`
	UpdatedAt time.Time `json:"updated_at"`
	// By is "dispatcher" (state.dispatch_error), "stage" (state.error) or "".
	By string `json:"by"`
	// Reason is the reason given, cut to ReasonMax characters.
	Reason string `json:"reason"`
}

// ReasonMax bounds the characters of a failure reason read from the database.
const ReasonMax = store.ReasonMax

// FailuresMax is how many recent failures a Snapshot holds.
const FailuresMax = store.FailuresMax

// Snapshot is one consistent read of the pipeline's state.
type Snapshot struct {
	// At is the database server's clock at the read.
	At time.Time `json:"at"`
	// ReadSeconds is how long the read took.
	ReadSeconds float64 `json:"read_seconds"`
	// Live has one entry per stage, sorted by name: every stage with rows in a
	// counted status, with statistics, or named by the configuration.
	Live []StageLive `json:"live"`
	// Stages are the rows of pepsi.stage_stats, sorted by stage.
	Stages []StageStats `json:"stages"`
	// StagePasses and MessagesLeft are pepsi.dispatch_stats: all stage passes,
	// fused included, and messages the dispatcher saw leave the pipeline.
	StagePasses  int64     `json:"stage_passes"`
	MessagesLeft int64     `json:"messages_left"`
	FlushedAt    time.Time `json:"flushed_at"`
	// DispatcherLocked says a session holds pepsi-dispatch's advisory lock.
	DispatcherLocked bool `json:"dispatcher_locked"`
	// Failures are the latest failed or timed-out messages, newest first.
	Failures []Failure `json:"failures"`
	// Table is the queue table's health (what vacuum has to do).
	Table TableHealth `json:"table"`
	// OrderKeys counts the messages waiting behind their order key.
	OrderKeys OrderKeys `json:"order_keys"`
	// Health is what the dispatcher recorded of each stage's workers
	// (pepsi.stage_health), sorted by stage. It is current only while
	// DispatcherLocked: otherwise it is what the last dispatcher left.
	Health []StageHealth `json:"health"`
}

// StageHealth is what pepsi-dispatch recorded of one stage's workers
// (core.Health): ok, cannot_start, crashing, pressure_held or rate_held,
// why, since when
// and, for a stage that cannot start, when it tries next.
type StageHealth struct {
	Stage  string           `json:"stage"`
	State  core.HealthState `json:"state"`
	Reason string           `json:"reason"`
	Since  time.Time        `json:"since"`
	// Until is when the spawn cooldown of a stage that cannot start ends;
	// absent for none.
	Until *time.Time `json:"until,omitempty"`
}

// Unhealthy says the state is one an operator must act on: the stage's
// program cannot start, or its workers keep crashing.
func (h StageHealth) Unhealthy() bool {
	return h.State == core.HealthCannotStart || h.State == core.HealthCrashing
}

// OrderKeys counts the messages waiting, blocked, behind an older message of
// their order key, and their keys by what that message (the key's head) is
// doing.
type OrderKeys struct {
	// Waiting is how many keys have blocked messages; Messages how many
	// those are.
	Waiting  int64 `json:"waiting"`
	Messages int64 `json:"messages"`
	// Of Waiting, the keys whose head is pending, running, paused by its
	// stage, paused for a retry (an answer 75), or none (its older messages
	// finished; the dispatcher hands the key on next).
	HeadPending  int64 `json:"head_pending"`
	HeadRunning  int64 `json:"head_running"`
	HeadPaused   int64 `json:"head_paused"`
	HeadRetrying int64 `json:"head_retrying"`
	HeadNone     int64 `json:"head_none"`
}

// TableHealth is pepsi.queue's health as the statistics collector sees it.
type TableHealth struct {
	// DeadTuples and LiveTuples are the collector's estimates of the table's
	// dead and live row versions.
	DeadTuples int64 `json:"dead_tuples"`
	LiveTuples int64 `json:"live_tuples"`
	// LastVacuum is the end of the last vacuum of the table, by pepsi-dispatch,
	// a DBA or autovacuum (zero if none since the statistics were reset, and
	// then left out of the JSON rather than shown as year 1).
	LastVacuum time.Time `json:"last_vacuum,omitzero"`
	// HorizonSeconds is how long the oldest transaction holding back the xmin
	// horizon has been open (0 if none is visible to this role).
	HorizonSeconds float64 `json:"horizon_seconds"`
}

// Read takes a Snapshot in one READ ONLY, REPEATABLE READ transaction, so every
// number in it is of the same instant. stages, if not empty, are stages to list
// even when the database knows nothing of them yet (the configuration's).
func Read(ctx context.Context, pool *pgxpool.Pool, stages []string) (*Snapshot, error) {
	start := time.Now()
	s := &Snapshot{Failures: []Failure{}} // none is [] in JSON, not null
	live := liveStages{}
	for _, name := range stages {
		live.stage(name)
	}
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		return readTx(ctx, tx, s, live)
	})
	if err != nil {
		return nil, fmt.Errorf("read the pipeline's state: %w", err)
	}
	for _, l := range live {
		s.Live = append(s.Live, *l)
	}
	slices.SortFunc(s.Live, func(a, b StageLive) int { return strings.Compare(a.Stage, b.Stage) })
	s.ReadSeconds = time.Since(start).Seconds()
	return s, nil
}

// liveStages are the stages of a Snapshot's Live, by name.
type liveStages map[string]*StageLive

// stage is the stage called name, made with every status at zero if it is new.
func (live liveStages) stage(name string) *StageLive {
	l := live[name]
	if l == nil {
		l = &StageLive{Stage: name, Messages: map[core.RowStatus]int64{}}
		for _, st := range Statuses {
			l.Messages[st] = 0
		}
		live[name] = l
	}
	return l
}

// readTx runs Read's queries in tx, filling s and live.
func readTx(ctx context.Context, tx pgx.Tx, s *Snapshot, live liveStages) error {
	q := store.On(tx)
	var err error
	if s.At, s.DispatcherLocked, err = q.MonitorLock(ctx); err != nil {
		return err
	}
	for _, read := range []func(context.Context) ([]store.StageDepth, error){q.MonitorPending, q.MonitorRunning, q.MonitorPaused,
		q.MonitorBlocked, q.MonitorFailed} {
		depths, err := read(ctx)
		if err != nil {
			return err
		}
		for _, d := range depths {
			l := live.stage(d.Stage)
			l.Messages[d.Status] = d.Count
			switch d.Status {
			case core.StatusPending:
				l.OldestPendingSeconds = d.OldestWait.Seconds()
			case core.StatusPaused:
				l.PausedDue, l.RetryWaiting = d.Due, d.RetryWaiting
			}
		}
	}
	k, err := q.CountKeysWaiting(ctx)
	if err != nil {
		return err
	}
	s.OrderKeys = OrderKeys{Waiting: k.Keys, Messages: k.Messages, HeadPending: k.HeadPending, HeadRunning: k.HeadRunning,
		HeadPaused: k.HeadPaused, HeadRetrying: k.HeadRetrying, HeadNone: k.HeadNone}
	failures, err := q.MonitorFailures(ctx)
	if err != nil {
		return err
	}
	for _, f := range failures {
		s.Failures = append(s.Failures, Failure{ID: f.ID, Stage: f.Stage, Status: string(f.Status), UpdatedAt: f.UpdatedAt, By: f.By, Reason: f.Reason})
	}
	stats, err := q.ReadStageStats(ctx)
	if err != nil {
		return err
	}
	for _, st := range stats {
		s.Stages = append(s.Stages, StageStats{Stage: st.Stage, PassesOK: st.Processed, FailedByDispatcher: st.Failed,
			WatchdogTimeouts: st.Timeouts, WorkerCrashes: st.Crashes, ProcessingSeconds: float64(st.ProcessingUS) / 1e6,
			Retries: st.Retries, RateHeldSeconds: float64(st.RateHeldUS) / 1e6,
			Emitted: st.Emitted, EmitsDropped: st.EmitsDropped, GuardMisses: st.GuardMisses, FlushedAt: st.UpdatedAt})
		live.stage(st.Stage)
	}
	t, err := q.MonitorTable(ctx)
	if err != nil {
		return err
	}
	s.Table = TableHealth{DeadTuples: t.DeadTuples, LiveTuples: t.LiveTuples, LastVacuum: t.LastVacuum, HorizonSeconds: t.Horizon.Seconds()}
	d, err := q.ReadDispatchStats(ctx)
	if err != nil {
		return err
	}
	s.StagePasses, s.MessagesLeft, s.FlushedAt = d.StagePasses, d.MessagesLeft, d.UpdatedAt
	health, err := q.ReadStageHealth(ctx)
	if err != nil {
		return err
	}
	for _, h := range health {
		sh := StageHealth{Stage: h.Stage, State: h.State, Reason: h.Reason, Since: h.Since}
		if !h.Until.IsZero() {
			sh.Until = &h.Until
		}
		s.Health = append(s.Health, sh)
	}
	return nil
}
