package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/tools/internal/dispatchproc"
)

// latencyWarmup is how many messages go through the pipeline before the
// latency is measured, so that every stage has its workers running and their
// connections open (WORKER_IDLE_TIMEOUT is 5 s; the offered load keeps them
// busy after that).
const latencyWarmup = 200

// latencyResult is the enqueue → done time of the messages of one latency run.
type latencyResult struct {
	messages      int
	offered       float64 // messages per second actually enqueued
	p50, p99, max time.Duration
}

func (l latencyResult) String() string {
	return fmt.Sprintf("%d messages at %.0f/s through a -> b -> c -> done, warm workers: enqueue → done p50 %.1f ms, p99 %.1f ms, max %.1f ms (server clock: created_at → updated_at)",
		l.messages, l.offered, ms(l.p50), ms(l.p99), ms(l.max))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// runLatency offers messages at a low, steady rate (-latency-rate per second for
// -latency-seconds) to a warm pipeline of variant v and reports the percentiles
// of their time from enqueue to done.
//
// The time is read on the server's clock, from the row's created_at (the now()
// of the single-row INSERT that enqueued it, a transaction of its own, so its
// commit and NOTIFY follow at once) to its updated_at when done (the now() of
// the transaction that wrote done: the stage's in write mode, the dispatcher's
// in library and answer mode). That transaction's own duration, its statements
// and its commit's WAL flush, is not in the figure.
func (b *bench) runLatency(ctx context.Context, v variant) (latencyResult, error) {
	var l latencyResult
	conn, err := b.freshQueue(ctx, latencyWarmup, stageConfig{})
	if err != nil {
		return l, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tag := "latency-" + string(v.mode)
	confFile, err := b.writeConf(v, "60", tag)
	if err != nil {
		return l, err
	}
	d, err := b.startDispatcher(confFile, tag)
	if err != nil {
		return l, err
	}
	// Killed on an early return; once it has stopped, Kill does nothing.
	defer d.Kill()
	if err := b.waitDone(ctx, conn, d, v, latencyWarmup); err != nil {
		return l, fmt.Errorf("warm-up: %w", err)
	}

	total := b.latencyRate * b.latencySeconds
	every := time.Second / time.Duration(b.latencyRate)
	start := time.Now()
	for i := range total {
		// Open loop: each message has its due time; a late insert does not
		// shift the ones after it.
		if wait := time.Until(start.Add(time.Duration(i) * every)); wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return l, ctx.Err()
			}
		}
		if _, err := conn.Exec(ctx, "INSERT INTO pepsi.queue (stage, payload) VALUES ($1, $2)", stageA, []byte("latency")); err != nil {
			return l, fmt.Errorf("enqueue: %w", err)
		}
	}
	l.offered = float64(total) / time.Since(start).Seconds()
	if err := b.waitDone(ctx, conn, d, v, latencyWarmup+total); err != nil {
		return l, err
	}
	if err := b.stopAndVerify(ctx, conn, d, latencyWarmup+total); err != nil {
		return l, err
	}
	err = l.read(ctx, conn, "ingress_id > $1", latencyWarmup)
	return l, err
}

// read reads into l how many rows where selects (a condition on
// pepsi.queue, with args) and the median, 99th percentile and longest of
// their latencies: from created_at to their last change.
func (l *latencyResult) read(ctx context.Context, conn *pgx.Conn, where string, args ...any) error {
	var p50, p99, longest float64
	err := conn.QueryRow(ctx, `SELECT count(*),
		percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - created_at)),
		percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - created_at)),
		max(extract(epoch FROM updated_at - created_at))
		FROM pepsi.queue WHERE `+where, args...).Scan(&l.messages, &p50, &p99, &longest)
	if err != nil {
		return fmt.Errorf("read the latencies: %w", err)
	}
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	l.p50, l.p99, l.max = sec(p50), sec(p99), sec(longest)
	return nil
}

// waitDone polls until n rows are done. It counts the rows, which is cheap at
// the latency run's sizes, rather than waiting for the dispatcher's statistics,
// which it flushes only when the pipeline goes idle.
func (b *bench) waitDone(ctx context.Context, conn *pgx.Conn, d *dispatchproc.Process, v variant, n int) error {
	return b.poll(ctx, d, v, n, "messages done", func() (done int64, err error) {
		err = conn.QueryRow(ctx, "SELECT count(*) FROM pepsi.queue WHERE status = 'done'").Scan(&done)
		return done, err
	})
}
