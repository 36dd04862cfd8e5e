package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/store"
)

// The history figure (-history): what pepsi.history costs to read and to
// keep at its size. A fresh database's history is filled with -history-rows
// rows (HistoryDays days of them, one partition each, a message's passes a
// few seconds apart as a pipeline's are), then pepsi-queue history's
// statement (store's History) reads random messages, and the dispatcher's
// upkeep drops the oldest day's partition.

// historyDays is how many daily partitions the figure's rows fill.
const historyDays = 7

// historyEventsPerMessage is how many rows each message of the figure has (a
// three-stage pipeline's passes, a retry and its wake).
const historyEventsPerMessage = 5

// historyLookups is how many messages the figure looks up.
const historyLookups = 500

// runHistory measures the history figure.
func (b *bench) runHistory(ctx context.Context) error {
	conn, err := b.migrated(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows := b.historyRows
	messages := rows / historyEventsPerMessage
	today := time.Now().UTC().Truncate(24 * time.Hour)
	first := today.AddDate(0, 0, -historyDays+1)
	fmt.Fprintf(b.out, "pepsi-bench -history: %d rows (%d messages of %d events) over %d daily partitions\n", messages*historyEventsPerMessage, messages, historyEventsPerMessage, historyDays)
	start := time.Now()
	if err := fillHistory(ctx, conn, messages, first); err != nil {
		return err
	}
	fmt.Fprintf(b.out, "  filled in %s\n", time.Since(start).Round(time.Second))

	// pepsi-queue history's statement, on random messages of every day: each
	// message's first read finds its pages outside shared buffers (the fill
	// wrote far more than they hold; the operating system's cache may still
	// have them), the second read of the same messages finds them there.
	q := store.On(conn)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	ids := make([]int64, historyLookups)
	for i := range ids {
		ids[i] = 1 + rng.Int64N(int64(messages))
	}
	for _, pass := range []string{"first read", "read again"} {
		var took []time.Duration
		for _, id := range ids {
			t0 := time.Now()
			hist, err := q.History(ctx, id)
			if err != nil {
				return fmt.Errorf("history of %d: %w", id, err)
			}
			took = append(took, time.Since(t0))
			if len(hist) != historyEventsPerMessage {
				return fmt.Errorf("history of %d: %d rows, want %d", id, len(hist), historyEventsPerMessage)
			}
		}
		slices.Sort(took)
		fmt.Fprintf(b.out, "  pepsi-queue history's read of one message (%d random messages, %s): median %s, p99 %s, max %s\n",
			historyLookups, pass, took[len(took)/2].Round(time.Microsecond), took[len(took)*99/100].Round(time.Microsecond), took[len(took)-1].Round(time.Microsecond))
	}

	// The dispatcher's upkeep, dropping the oldest day.
	var oldRows int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pepsi.history WHERE at < $1`, first.AddDate(0, 0, 1)).Scan(&oldRows); err != nil {
		return err
	}
	now := today.Add(12 * time.Hour)
	t0 := time.Now()
	if _, err := conn.Exec(ctx, `SELECT pepsi.history_keep($1, $1, $2, $3)`, now, now.Add(72*time.Hour), first.AddDate(0, 0, 1)); err != nil {
		return fmt.Errorf("upkeep: %w", err)
	}
	dropped := time.Since(t0)
	var left, dead int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pepsi.history WHERE at < $1`, first.AddDate(0, 0, 1)).Scan(&left); err != nil {
		return err
	}
	if err := conn.QueryRow(ctx, `SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relname LIKE 'history_%'`).Scan(&dead); err != nil {
		return err
	}
	fmt.Fprintf(b.out, "  the upkeep that dropped the oldest day (%d rows): %s; rows of that day left: %d; dead rows in the history's partitions: %d\n",
		oldRows, dropped.Round(time.Microsecond), left, dead)
	return nil
}

// fillHistory fills the history with messages' events, historyDays days of
// them from first, each day in its partition, and analyses it.
func fillHistory(ctx context.Context, conn *pgx.Conn, messages int, first time.Time) error {
	perDay := (messages + historyDays - 1) / historyDays
	for d := 0; d < historyDays; d++ {
		day := first.AddDate(0, 0, d)
		if _, err := conn.Exec(ctx, `SELECT pepsi.history_day($1::date, true)`, day.Format("2006-01-02")); err != nil {
			return fmt.Errorf("make the partition of %s: %w", day.Format("2006-01-02"), err)
		}
		lo, hi := int64(d*perDay+1), int64(min((d+1)*perDay, messages))
		for from := lo; from <= hi; from += enqueueSlice {
			// A message's events are seconds apart within its day.
			if _, err := conn.Exec(ctx, `INSERT INTO pepsi.history (ingress_id, stage, event, detail, handed_at, at, worker_pid, attempts)
				SELECT g, (ARRAY['a', 'a', 'a', 'b', 'c'])[e], (ARRAY['retry', 'woken', 'moved', 'moved', 'done'])[e],
				       (ARRAY['busy', '', 'b', 'c', ''])[e],
				       CASE WHEN e <> 2 THEN $1::timestamptz + (g - $2) * interval '1 ms' + e * interval '1 s' - interval '10 ms' END,
				       $1::timestamptz + (g - $2) * interval '1 ms' + e * interval '1 s', CASE WHEN e <> 2 THEN 4000 + (g % 8)::int END,
				       CASE WHEN e = 3 THEN 1 ELSE 0 END
				FROM generate_series($3::bigint, $4::bigint) g, generate_series(1, $5) e`,
				day.Add(time.Hour), lo, from, min(from+enqueueSlice-1, hi), historyEventsPerMessage); err != nil {
				return fmt.Errorf("fill the history: %w", err)
			}
		}
	}
	for _, sql := range []string{"ANALYZE pepsi.history", "CHECKPOINT"} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	return nil
}
