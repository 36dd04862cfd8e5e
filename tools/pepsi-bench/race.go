package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The racing producers of -race: each inserts one message per transaction,
// holds that transaction open for up to raceHoldMax after its insert, and
// pauses up to racePauseMax before the next, so the dispatcher goes idle and
// takes its gate again and again while producers' transactions are open
// (docs/durability.md, "Notifications only when the dispatcher waits").
const (
	raceProducers = 3
	raceHoldMax   = 20 * time.Millisecond
	racePauseMax  = 600 * time.Millisecond
	// raceLate is the wait that counts a message as late in the report.
	raceLate = 50 * time.Millisecond
)

// raceResult is the commit → done time of the messages of one race run.
type raceResult struct {
	messages      int
	p50, p99, max time.Duration
	late          int // messages done more than raceLate after their commit
}

func (r raceResult) String() string {
	return fmt.Sprintf("%d messages: commit → done p50 %.1f ms, p99 %.1f ms, max %.1f ms; %d done later than %s after their commit",
		r.messages, ms(r.p50), ms(r.p99), ms(r.max), r.late, raceLate)
}

// runRaces runs -rounds race runs in each mode at the bench configuration and
// reports each run's percentiles.
func (b *bench) runRaces(ctx context.Context) error {
	fmt.Fprintf(b.out, "pepsi-bench -race: %d producers, each one message per transaction held open 0–%s, then a pause of 0–%s; "+
		"%d s per run, %d runs per mode, a -> b -> c -> done at %s, POLL_INTERVAL 30 s, warm workers\n",
		raceProducers, raceHoldMax, racePauseMax, b.latencySeconds, b.rounds, b.benchConfig)
	for _, m := range b.modes {
		v := variant{mode: m, cfg: b.benchConfig}
		for i := 1; i <= b.rounds; i++ {
			r, err := b.runRace(ctx, v, uint64(i))
			if errors.Is(err, errRefused) {
				b.refuse(m, err)
				break
			}
			if err != nil {
				return fmt.Errorf("race, %s, run %d: %w", v, i, err)
			}
			fmt.Fprintf(b.out, "race, %s mode, run %d: %s\n", m, i, r)
		}
	}
	return b.refusedError()
}

// runRace offers the racing producers' messages to a warm pipeline of variant v
// for -latency-seconds and measures, per message, the time from just before
// its COMMIT was sent (the client's clock) to the transaction that made it done
// (updated_at, the server's clock: the same machine's).
func (b *bench) runRace(ctx context.Context, v variant, seed uint64) (raceResult, error) {
	var r raceResult
	conn, err := b.freshQueue(ctx, latencyWarmup, stageConfig{})
	if err != nil {
		return r, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tag := "race-" + string(v.mode)
	confFile, err := b.writeConf(v, "60", tag)
	if err != nil {
		return r, err
	}
	d, err := b.startDispatcher(confFile, tag)
	if err != nil {
		return r, err
	}
	// Killed on an early return; once it has stopped, Kill does nothing.
	defer d.Kill()
	if err := b.waitDone(ctx, conn, d, v, latencyWarmup); err != nil {
		return r, fmt.Errorf("warm-up: %w", err)
	}
	commits, err := b.race(ctx, seed)
	if err != nil {
		return r, err
	}
	if err := b.waitDone(ctx, conn, d, v, latencyWarmup+len(commits)); err != nil {
		return r, err
	}
	if err := b.stopAndVerify(ctx, conn, d, latencyWarmup+len(commits)); err != nil {
		return r, err
	}
	return raceWaits(ctx, conn, commits)
}

// race runs the producers for -latency-seconds and returns when each message's
// COMMIT was sent, by id.
func (b *bench) race(ctx context.Context, seed uint64) (map[int64]time.Time, error) {
	var (
		mu      sync.Mutex
		commits = map[int64]time.Time{}
		wg      sync.WaitGroup
		errs    = make([]error, raceProducers)
	)
	end := time.Now().Add(time.Duration(b.latencySeconds) * time.Second)
	for p := range raceProducers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(p)))
			errs[p] = b.produce(ctx, rng, end, func(id int64, at time.Time) {
				mu.Lock()
				commits[id] = at
				mu.Unlock()
			})
		}()
	}
	wg.Wait()
	return commits, errors.Join(errs...)
}

// produce is one racing producer, on a connection of its own, until end.
func (b *bench) produce(ctx context.Context, rng *rand.Rand, end time.Time, committed func(int64, time.Time)) error {
	conn, err := pgx.Connect(ctx, b.url)
	if err != nil {
		return fmt.Errorf("producer: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for time.Now().Before(end) {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return fmt.Errorf("producer: begin: %w", err)
		}
		var id int64
		if err := tx.QueryRow(ctx, "INSERT INTO pepsi.queue (stage, payload) VALUES ($1, $2) RETURNING ingress_id",
			stageA, []byte("race")).Scan(&id); err != nil {
			tx.Rollback(context.WithoutCancel(ctx))
			return fmt.Errorf("producer: insert: %w", err)
		}
		sleep(ctx, time.Duration(rng.Int64N(int64(raceHoldMax))))
		at := time.Now()
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("producer: commit: %w", err)
		}
		committed(id, at)
		sleep(ctx, time.Duration(rng.Int64N(int64(racePauseMax))))
	}
	return ctx.Err()
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// raceWaits reads when each raced message was done and sums up the waits.
func raceWaits(ctx context.Context, conn *pgx.Conn, commits map[int64]time.Time) (raceResult, error) {
	var r raceResult
	rows, err := conn.Query(ctx, "SELECT ingress_id, updated_at FROM pepsi.queue WHERE ingress_id > $1", latencyWarmup)
	if err != nil {
		return r, fmt.Errorf("read the done times: %w", err)
	}
	var waits []time.Duration
	for rows.Next() {
		var id int64
		var done time.Time
		if err := rows.Scan(&id, &done); err != nil {
			return r, fmt.Errorf("read the done times: %w", err)
		}
		at, ok := commits[id]
		if !ok {
			return r, fmt.Errorf("message %d was done but no producer committed it", id)
		}
		waits = append(waits, max(0, done.Sub(at)))
	}
	if err := rows.Err(); err != nil {
		return r, fmt.Errorf("read the done times: %w", err)
	}
	if len(waits) != len(commits) {
		return r, fmt.Errorf("%d messages committed, %d found", len(commits), len(waits))
	}
	if len(waits) == 0 {
		return r, errors.New("no message was committed: raise -latency-seconds")
	}
	slices.Sort(waits)
	r.messages = len(waits)
	r.p50 = waits[len(waits)/2]
	r.p99 = waits[(len(waits)*99)/100]
	r.max = waits[len(waits)-1]
	for _, w := range waits {
		if w > raceLate {
			r.late++
		}
	}
	return r, nil
}
