package store

import (
	"context"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
)

// Executor is the contract of pepsi.queue: the dispatcher's batched step
// (Exec) and the statements the operator's tools, pepsi-ingress,
// pepsi-httpd, the stage library and the dispatcher's health record run,
// one method each, with a params struct where a statement
// takes more than one value, in the manner of River's riverdriver.Executor.
// Two queues implement it: PostgreSQL (*Queue, whose statement methods run on
// its pool; PG runs them on a connection or transaction of the caller's) and
// the simulator's fake (sim/fakequeue). The conformance suite
// (internal/testenv/queuetest) runs every method against both, so the
// simulator cannot drift from reality.
type Executor interface {
	// Exec runs cmds (each one of core.KeepHistory, core.ResetOrphans, core.Resolve,
	// core.Release, core.Wake, core.Claim, core.Flush) in order in one
	// transaction and returns one result event per command, in the same order
	// (core.HistoryKept, core.OrphansReset, core.Resolved, core.Released, core.Woken,
	// core.Claimed, core.Flushed), each with the same Op. If the
	// transaction fails, every result carries the error text: the caller cannot know
	// whether it committed, and the core is written for both.
	Exec(ctx context.Context, cmds []core.Command) []core.Event

	Enqueue(ctx context.Context, p EnqueueParams) (EnqueueResult, error)
	CountRows(ctx context.Context) ([]Depth, error)
	ReadStageStats(ctx context.Context) ([]StageStats, error)
	ReadDispatchStats(ctx context.Context) (DispatchStats, error)
	CountPending(ctx context.Context, stages []string, limit int64) (map[string]int64, error)
	Show(ctx context.Context, id int64) (*Message, error)
	Retry(ctx context.Context, p RetryParams) (int64, error)
	NotifyIngress(ctx context.Context) error
	PurgeCutoff(ctx context.Context, olderThan time.Duration) (time.Time, error)
	PurgeBatch(ctx context.Context, p PurgeParams) (PurgeResult, error)
	SchemaVersion(ctx context.Context) (int, error)

	List(ctx context.Context, p ListParams) ([]Listed, error)
	CountSelected(ctx context.Context, sel Selection) (int64, error)
	Discard(ctx context.Context, p DiscardParams) (int64, error)
	CountKeysWaiting(ctx context.Context) (KeysWaiting, error)

	StageRead(ctx context.Context, ids []int64) ([]StageRow, error)
	StageLock(ctx context.Context, id int64) (StageLocked, error)
	StageTransition(ctx context.Context, p StageTransitionParams) (moved bool, err error)

	InsertIngress(ctx context.Context, rows []IngressRow) ([]int64, error)

	MonitorLock(ctx context.Context) (at time.Time, locked bool, err error)
	MonitorPending(ctx context.Context) ([]StageDepth, error)
	MonitorRunning(ctx context.Context) ([]StageDepth, error)
	MonitorPaused(ctx context.Context) ([]StageDepth, error)
	MonitorBlocked(ctx context.Context) ([]StageDepth, error)
	MonitorFailed(ctx context.Context) ([]StageDepth, error)
	MonitorFailures(ctx context.Context) ([]Failure, error)
	MonitorTable(ctx context.Context) (TableHealth, error)
	FailedIndexExists(ctx context.Context) (bool, error)

	WriteHealth(ctx context.Context, hs []core.StageHealth) error
	ReadStageHealth(ctx context.Context) ([]StageHealth, error)
	StageHealthExists(ctx context.Context) (bool, error)
	ReadPageMessage(ctx context.Context, id int64) (PageMessage, error)

	History(ctx context.Context, id int64) ([]HistoryRow, error)
	HistoryPartitions(ctx context.Context) ([]time.Time, error)
}

// PostgreSQL's executor holds to the contract.
var _ Executor = (*Queue)(nil)
