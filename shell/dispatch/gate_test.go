package dispatch_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The gate (schema 4, core.Rest and core.Busy): producers notify only while the
// dispatcher waits. These tests run a real dispatcher whose heartbeat is ten
// minutes away, so a message that missed its wake-up would wait for minutes:
// every one must be claimed within seconds.

// gateConf: one stage that finishes each message at once; POLL_INTERVAL far
// beyond the test.
const gateConf = "[pepsi-dispatch]\nPOLL_INTERVAL = 10m\n[stage-a]\nPROGRAM = @BIN@/teststage\nPARALLELISM = 2\nQUEUE_LIMIT = 4\n"

// heartbeatWait is a latency no message may reach: only a missed wake-up (the
// heartbeat ten minutes away) could explain it on any machine.
const heartbeatWait = 20 * time.Second

// recordClaims makes the test database note when each row was first claimed
// (pending to running), by the server's clock.
func (e *env) recordClaims() {
	e.t.Helper()
	_, err := e.db.Exec(context.Background(), `
		CREATE TABLE public.claimed_at (ingress_id bigint PRIMARY KEY, at timestamptz NOT NULL);
		CREATE FUNCTION public.record_claim() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO public.claimed_at VALUES (NEW.ingress_id, clock_timestamp()) ON CONFLICT DO NOTHING;
			RETURN NULL;
		END $$;
		CREATE TRIGGER record_claim AFTER UPDATE ON pepsi.queue FOR EACH ROW
			WHEN (OLD.status = 'pending' AND NEW.status = 'running') EXECUTE FUNCTION public.record_claim();`)
	if err != nil {
		e.t.Fatalf("record claims: %v", err)
	}
}

// claimLatencies returns, for each id committed at the instant in committed,
// how long after that its claim came (or heartbeatWait when it never came).
func (e *env) claimLatencies(committed map[int64]time.Time) []time.Duration {
	e.t.Helper()
	rows, err := e.db.Query(context.Background(), `SELECT ingress_id, at FROM public.claimed_at`)
	if err != nil {
		e.t.Fatal(err)
	}
	at := map[int64]time.Time{}
	var id int64
	var ts time.Time
	if _, err := pgx.ForEachRow(rows, []any{&id, &ts}, func() error { at[id] = ts; return nil }); err != nil {
		e.t.Fatal(err)
	}
	var out []time.Duration
	for id, c := range committed {
		a, ok := at[id]
		if !ok {
			out = append(out, heartbeatWait)
			continue
		}
		out = append(out, a.Sub(c))
	}
	slices.Sort(out)
	return out
}

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}

// produce inserts one message in its own transaction, holding the transaction
// open for hold after the insert (the trigger has run: the producer decided
// whether to notify), and returns its id and the instant just before COMMIT.
func produce(ctx context.Context, db *pgxpool.Pool, hold time.Duration) (int64, time.Time, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, time.Time{}, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
	var id int64
	if err := tx.QueryRow(ctx, `INSERT INTO pepsi.queue (stage, payload) VALUES ('a', convert_to('a=done', 'UTF8')) RETURNING ingress_id`).Scan(&id); err != nil {
		return 0, time.Time{}, err
	}
	if hold > 0 {
		time.Sleep(hold)
	}
	at := time.Now()
	return id, at, tx.Commit(ctx)
}

func TestNoMessageWaitsForTheHeartbeatWhileProducersRaceTheDispatcherGoingIdle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, gateConf)
	e.recordClaims()
	pcfg, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 8
	db, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	e.start()
	const producers, each = 6, 120
	var mu sync.Mutex
	committed := map[int64]time.Time{}
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(p), 10))
			for range each {
				// Transactions of random length, committing at random points
				// of the dispatcher's going idle (RestAfter is 2 ms) and waking.
				hold := time.Duration(0)
				if r.IntN(3) > 0 {
					hold = time.Duration(r.IntN(20_000)) * time.Microsecond
				}
				id, at, err := produce(context.Background(), db, hold)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				committed[id] = at
				mu.Unlock()
				time.Sleep(time.Duration(r.IntN(30_000)) * time.Microsecond)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("producer: %v", err)
	}
	e.waitCounts(heartbeatWait, map[string]int{"done": producers * each})
	lat := e.claimLatencies(committed)
	t.Logf("%d messages from %d producers, claimed after their commit: p50 %v, p99 %v, max %v (POLL_INTERVAL 10m)",
		len(lat), producers, quantile(lat, 0.5), quantile(lat, 0.99), lat[len(lat)-1])
	if worst := lat[len(lat)-1]; worst >= heartbeatWait {
		t.Errorf("a message was claimed %v after its commit: it waited for the heartbeat", worst)
	}
}

// TestIdleLatencyOfASingleMessage reports how soon a single message on an idle
// system is claimed after its commit (the dispatcher waits: its producer
// notifies). It asserts only that none waits for the heartbeat; the figures
// are for the reader (docs/performance.md).
func TestIdleLatencyOfASingleMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, gateConf)
	e.recordClaims()
	e.start()
	const tries = 200
	committed := map[int64]time.Time{}
	ctx := context.Background()
	for i := range tries {
		// Long enough for the dispatcher to finish the last one and rest.
		time.Sleep(20 * time.Millisecond)
		id, at, err := produce(ctx, e.db, 0)
		if err != nil {
			t.Fatalf("try %d: %v", i, err)
		}
		committed[id] = at
		waitFor(t, heartbeatWait, fmt.Sprintf("message %d claimed", id), func() (bool, string) {
			var n int
			err := e.db.QueryRow(ctx, `SELECT count(*) FROM public.claimed_at WHERE ingress_id = $1`, id).Scan(&n)
			return err == nil && n == 1, fmt.Sprint(err)
		})
	}
	lat := e.claimLatencies(committed)
	t.Logf("idle latency, commit to claim, over %d tries: p50 %v, p99 %v, max %v",
		len(lat), quantile(lat, 0.5), quantile(lat, 0.99), lat[len(lat)-1])
}
