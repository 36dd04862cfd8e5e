// Package writelog records every write of a queue row, for tests and for
// pepsi-chaos: a trigger appends the row, the writer's application_name, the
// time (clock_timestamp) and the status and stage before and after to
// public.queue_writes. It is test tooling: never install it on a production
// queue (it doubles the writes).
//
// CheckOwnership turns the log into a proof that no worker wrote a message its
// dispatcher did not hold.
package writelog

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Write is one line of the log. Writes of one row are serialized by its row
// lock, so their Seq order is the order of the row's versions.
type Write struct {
	Seq, ID                                  int64
	App                                      string
	At                                       time.Time
	OldStatus, NewStatus, OldStage, NewStage string
}

func (w Write) String() string {
	return fmt.Sprintf("#%d %s %s: %s@%s -> %s@%s", w.Seq, w.At.Format("15:04:05.000"), w.App, w.OldStatus, w.OldStage, w.NewStatus, w.NewStage)
}

// DB is what the log needs of a connection or a pool.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Install creates the log table and the trigger in db's database.
func Install(ctx context.Context, db DB) error {
	_, err := db.Exec(ctx, `
		CREATE TABLE public.queue_writes (seq bigserial PRIMARY KEY, ingress_id bigint, app text,
			at timestamptz DEFAULT clock_timestamp(), old_status text, new_status text, old_stage text, new_stage text);
		CREATE FUNCTION public.log_queue_write() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO public.queue_writes (ingress_id, app, old_status, new_status, old_stage, new_stage)
			VALUES (NEW.ingress_id, current_setting('application_name'), OLD.status, NEW.status, OLD.stage, NEW.stage);
			RETURN NEW;
		END $$;
		CREATE TRIGGER log_queue_write AFTER UPDATE ON pepsi.queue FOR EACH ROW EXECUTE FUNCTION public.log_queue_write();`)
	if err != nil {
		return fmt.Errorf("install the write log: %w", err)
	}
	return nil
}

// Read returns the log's writes with Seq > after, in Seq order.
func Read(ctx context.Context, db DB, after int64) ([]Write, error) {
	rows, err := db.Query(ctx, `SELECT seq, ingress_id, app, at, old_status, new_status, old_stage, new_stage
		FROM public.queue_writes WHERE seq > $1 ORDER BY seq`, after)
	if err != nil {
		return nil, fmt.Errorf("read the write log: %w", err)
	}
	ws, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Write])
	if err != nil {
		return nil, fmt.Errorf("read the write log: %w", err)
	}
	return ws, nil
}

// CheckOwnership proves that no message was written on behalf of a dispatcher
// that did not hold it. Walking each message's writes in order:
//
//   - a claim (pending -> running) by dispatcher D makes D the owner;
//   - a reset (running -> pending at the same stage) by a dispatcher ends the
//     ownership (start-up and orphan resets, requeues of a stage's own advance);
//   - a wake (paused -> pending) needs no owner;
//   - any other write of a running row, by a worker of dispatcher X (workerOf
//     maps the worker's application_name to X's) or by dispatcher X itself
//     (a transition a stage answered, a failure, a timeout), is allowed only
//     while X owns the row.
//
// It returns the violations, each with the message's history.
func CheckOwnership(writes []Write, workerOf map[string]string) []string {
	byID := map[int64][]Write{}
	var ids []int64
	for _, w := range writes {
		if _, ok := byID[w.ID]; !ok {
			ids = append(ids, w.ID)
		}
		byID[w.ID] = append(byID[w.ID], w)
	}
	var bad []string
	for _, id := range ids {
		owner := ""
		for _, w := range byID[id] {
			dispatcher, isWorker := workerOf[w.App]
			if !isWorker {
				dispatcher = w.App
			}
			switch {
			case !isWorker && w.OldStatus == "pending" && w.NewStatus == "running":
				owner = w.App
			case !isWorker && w.OldStatus == "running" && w.NewStatus == "pending" && w.OldStage == w.NewStage:
				owner = ""
			case w.OldStatus != "running":
				// wakes, and writes of rows no dispatcher holds (tools, tests)
			case dispatcher != owner:
				var hist []string
				for _, h := range byID[id] {
					hist = append(hist, h.String())
				}
				bad = append(bad, fmt.Sprintf("message %d: %s wrote it while %q held it:\n  %s",
					id, w.App, owner, strings.Join(hist, "\n  ")))
			}
		}
	}
	return bad
}
