package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// HistoryRow is one row of pepsi.history: one event of one message
// (docs/operations.md, "History"). Its JSON form is pepsi-queue history
// -json's and pepsi-httpd's (/api/messages/ID).
type HistoryRow struct {
	ID    int64  `json:"id"`
	Stage string `json:"stage"`
	// Event is a pass's outcome (core.HistoryMoved and the rest) or a
	// transition without a pass (woken, reset, retried, and a discard's
	// failed).
	Event  string `json:"event"`
	Detail string `json:"detail,omitempty"`
	// HandedAt is when the pass's line was written to its worker; nil for a
	// transition without a pass, or a message requeued before it was handed.
	HandedAt *time.Time `json:"handed_at,omitempty"`
	// At is when the event happened (a pass: when its answer was read).
	At time.Time `json:"at"`
	// WorkerPID is the pass's worker; 0 for none.
	WorkerPID int `json:"worker_pid,omitempty"`
	// Attempts is the message's attempts at the event.
	Attempts int `json:"attempts"`
}

// historySQL reads one message's history in the order it happened. Each
// day's partition is probed through its (ingress_id, at) index.
const historySQL = `SELECT ingress_id, stage, event, detail, handed_at, at, coalesce(worker_pid, 0), attempts
FROM pepsi.history WHERE ingress_id = $1 ORDER BY at, seq`

// History reads message id's history, oldest first (none for an id with no
// rows: the message may not exist, or its history may have been dropped).
func (s *PG) History(ctx context.Context, id int64) ([]HistoryRow, error) {
	return collect(ctx, s.db, "read history", func(r pgx.CollectableRow) (HistoryRow, error) {
		var h HistoryRow
		err := r.Scan(&h.ID, &h.Stage, &h.Event, &h.Detail, &h.HandedAt, &h.At, &h.WorkerPID, &h.Attempts)
		return h, err
	}, historySQL, id)
}

// HistoryLatestMax is how many of a message's latest events pepsi-httpd's
// message page reads (HistoryLatest): a message that went round its stages
// for days may have millions, and one page read them all into memory.
const HistoryLatestMax = 1000

// historyLatestSQL reads message id's latest $2 events, in the order they
// happened: each day's partition probed backwards through its (ingress_id,
// at) index, so its cost is the events read, not the events kept.
const historyLatestSQL = `SELECT * FROM (SELECT ingress_id, stage, event, detail, handed_at, at, coalesce(worker_pid, 0), attempts, seq
	FROM pepsi.history WHERE ingress_id = $1 ORDER BY at DESC, seq DESC LIMIT $2) h ORDER BY at, seq`

// HistoryLatest reads message id's latest max events, oldest first, and
// says whether it has older ones than those (which History reads).
func (s *PG) HistoryLatest(ctx context.Context, id int64, max int) (rows []HistoryRow, older bool, err error) {
	rows, err = collect(ctx, s.db, "read history", func(r pgx.CollectableRow) (HistoryRow, error) {
		var h HistoryRow
		var seq int64
		err := r.Scan(&h.ID, &h.Stage, &h.Event, &h.Detail, &h.HandedAt, &h.At, &h.WorkerPID, &h.Attempts, &seq)
		return h, err
	}, historyLatestSQL, id, max+1)
	if len(rows) > max {
		return rows[1:], true, err
	}
	return rows, false, err
}

// HistoryPartitions lists pepsi.history's daily partitions, the first day of
// each (UTC), oldest first: what the dispatcher's upkeep has made and not yet
// dropped.
func (s *PG) HistoryPartitions(ctx context.Context) ([]time.Time, error) {
	return collect(ctx, s.db, "list history partitions", func(r pgx.CollectableRow) (time.Time, error) {
		var d time.Time
		err := r.Scan(&d)
		return d.UTC(), err
	}, historyPartitionsSQL)
}

// historyPartitionsSQL lists the days of pepsi.history's partitions (named
// history_YYYYMMDD by schema 16's pepsi.history_day).
const historyPartitionsSQL = `SELECT to_date(substr(c.relname, 9), 'YYYYMMDD')::timestamp AT TIME ZONE 'UTC'
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'pepsi.history'::regclass AND c.relname ~ '^history_[0-9]{8}$'
ORDER BY 1`
