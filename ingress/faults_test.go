package ingress_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/ingress"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/netfault"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// dial opens a connection of its own to the server, closed when the test
// ends.
func (f *fixture) dial(t *testing.T) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", f.http.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// rawRequest sends head and then body over a connection of its own, and
// returns the connection.
func rawRequest(t *testing.T, f *fixture, contentLength int, part string) net.Conn {
	t.Helper()
	c := f.dial(t)
	fmt.Fprintf(c, "POST /v1/messages?stage=a HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\nContent-Length: %d\r\n\r\n%s", contentLength, part)
	return c
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

func TestASlowClientIsCutOffAndInsertsNothing(t *testing.T) {
	t.Parallel()
	timeouts := ingress.TimeoutsDefault
	timeouts.ReadHeader, timeouts.Read = 300*time.Millisecond, 600*time.Millisecond
	f := startWith(t, "", nil, timeouts)
	// A body that trickles in slower than the read timeout allows.
	body := "{\"payload\": \"first\"}\n{\"payload\": \"second\"}\n"
	c := rawRequest(t, f, len(body), body[:10])
	go func() {
		for i := 10; i < len(body); i++ {
			time.Sleep(100 * time.Millisecond)
			if _, err := c.Write([]byte{body[i]}); err != nil {
				return
			}
		}
	}()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	answer, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(answer), "HTTP/1.1 408 ") && len(answer) != 0 {
		t.Errorf("slow body answered %q; want 408 or a closed connection", answer)
	}
	// Headers that never end.
	h := f.dial(t)
	fmt.Fprintf(h, "POST /v1/messages HTTP/1.1\r\nHost: x\r\n")
	h.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	if _, err := io.ReadAll(h); err != nil {
		t.Errorf("a client that never finishes its headers: %v after %v; want the server to close the connection", err, time.Since(start))
	}
	if n := f.count(); n != 0 {
		t.Errorf("%d rows inserted; want none", n)
	}
	waitFor(t, "the 408 counted", func() bool { return f.metric(`pepsi_ingress_requests_total{code="408"}`) == 1 })
}

func TestAConnectionClosedMidBodyInsertsNothing(t *testing.T) {
	t.Parallel()
	f := start(t, "", nil)
	body := "{\"payload\": \"first\"}\n{\"payload\": \"second\"}\n"
	c := rawRequest(t, f, len(body)+100, body)
	time.Sleep(100 * time.Millisecond)
	c.Close()
	waitFor(t, "the cut-off request answered 400", func() bool { return f.metric(`pepsi_ingress_requests_total{code="400"}`) == 1 })
	if n := f.count(); n != 0 {
		t.Errorf("%d rows inserted; want none", n)
	}
}

func TestMaxPendingRefusesAStageTooFarBehindWith503(t *testing.T) {
	t.Parallel()
	f := start(t, "", func(o *ingress.Options) { o.MaxPending = 3; o.PendingInterval = 50 * time.Millisecond })
	if a := f.post("application/x-ndjson", "?stage=a", strings.Repeat("{\"payload\": \"x\"}\n", 4)); a.code != 202 {
		t.Fatalf("first request: %+v; want 202 (the stage was empty)", a)
	}
	var a answer
	waitFor(t, "a 503 once the stage has 4 pending", func() bool {
		a = f.post("application/json", "?stage=a", `{"payload": "y"}`)
		return a.code == 503
	})
	if a.retry != "1" || !strings.Contains(a.err, `stage "a" has more than 3 pending messages`) {
		t.Errorf("answer %+v; want Retry-After: 1 and the reason", a)
	}
	if b := f.post("application/json", "?stage=b", `{"payload": "y"}`); b.code != 202 {
		t.Errorf("another stage: %+v; want 202", b)
	}
	if _, err := f.conn.Exec(context.Background(), `UPDATE pepsi.queue SET status = 'done' WHERE stage = 'a'`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "202 once the stage drained", func() bool {
		return f.post("application/json", "?stage=a", `{"payload": "z"}`).code == 202
	})
}

// A stage's own MAX_PENDING wins over [pepsi-ingress]'s for that stage, lower
// or higher; and a stage's own limit counts alone when [pepsi-ingress] has
// none (the next test).
func TestAStagesOwnMaxPendingWinsForItsStage(t *testing.T) {
	t.Parallel()
	f := start(t, "", func(o *ingress.Options) {
		o.MaxPending = 3
		o.StageMaxPending = map[string]int64{"a": 1, "b": 6}
		o.PendingInterval = 50 * time.Millisecond
	})
	// b first: a count that finds a over its limit was read after b's commit.
	for _, stage := range []string{"b", "a"} {
		if a := f.post("application/x-ndjson", "?stage="+stage, strings.Repeat("{\"payload\": \"x\"}\n", 5)); a.code != 202 {
			t.Fatalf("first request into %s: %+v; want 202 (the stage was empty)", stage, a)
		}
	}
	var a answer
	waitFor(t, "a 503 at a, over its own 1", func() bool {
		a = f.post("application/json", "?stage=a", `{"payload": "y"}`)
		return a.code == 503
	})
	if !strings.Contains(a.err, `stage "a" has more than 1 pending messages`) {
		t.Errorf("answer %+v; want a's own limit named", a)
	}
	if b := f.post("application/json", "?stage=b", `{"payload": "y"}`); b.code != 202 {
		t.Fatalf("b with 5 pending, over [pepsi-ingress]'s 3 but within its own 6: %+v; want 202", b)
	}
	waitFor(t, "a 503 at b, over its own 6", func() bool {
		a = f.post("application/json", "?stage=b", `{"payload": "y"}`)
		return a.code == 503
	})
	if !strings.Contains(a.err, `stage "b" has more than 6 pending messages`) {
		t.Errorf("answer %+v; want b's own limit named", a)
	}
}

func TestAStagesOwnMaxPendingCountsWithoutIngressOne(t *testing.T) {
	t.Parallel()
	f := start(t, "", func(o *ingress.Options) {
		o.StageMaxPending = map[string]int64{"a": 2}
		o.PendingInterval = 50 * time.Millisecond
	})
	f.post("application/x-ndjson", "?stage=a", strings.Repeat("{\"payload\": \"x\"}\n", 3))
	waitFor(t, "a 503 at a, over its own 2", func() bool {
		return f.post("application/json", "?stage=a", `{"payload": "y"}`).code == 503
	})
}

// proxied starts an ingress whose database connections go through a fault
// proxy.
func proxied(t *testing.T, change func(*ingress.Options)) (*fixture, *netfault.Proxy) {
	t.Helper()
	db := pgtest.NewMigrated(t)
	cfg, err := pgx.ParseConfig(db)
	if err != nil {
		t.Fatal(err)
	}
	p, err := netfault.Start(fmt.Sprintf("%s:%d", cfg.Host, cfg.Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	via := fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&connect_timeout=2", cfg.User, p.Addr(), cfg.Database)
	f := start(t, via, change)
	// The checks read the database directly, not through the proxy.
	f.conn = pgtest.Connect(t, db)
	return f, p
}

func TestAnUnreachableDatabaseGets503AndRetryAfter(t *testing.T) {
	t.Parallel()
	f, p := proxied(t, nil)
	if a := f.post("application/json", "?stage=a", `{"payload": "x"}`); a.code != 202 {
		t.Fatalf("before the fault: %+v", a)
	}
	p.Refuse()
	p.ResetAll()
	a := f.post("application/json", "?stage=a", `{"payload": "y", "key": "y"}`)
	if a.code != 503 || a.retry != "1" {
		t.Errorf("database unreachable: %+v; want 503 with Retry-After: 1", a)
	}
	// The last try could not even connect: nothing of it reached the server.
	if !strings.Contains(a.err, "nothing of this request was committed") {
		t.Errorf("database unreachable, no connection made: %q; want it to say nothing was committed", a.err)
	}
	if res, err := http.Get(f.http.URL + "/healthz"); err != nil || res.StatusCode != 503 {
		t.Errorf("/healthz with the database unreachable: %v %v; want 503", res.StatusCode, err)
	}
	p.Heal()
	waitFor(t, "202 once the database is back", func() bool {
		return f.post("application/json", "?stage=a", `{"payload": "y", "key": "y"}`).code == 202
	})
	if n := f.count(); n != 2 {
		t.Errorf("%d rows; want 2", n)
	}
}

// TestADatabaseLostMidRequestNeverAnswers202ForWhatIsNotCommitted runs
// clients that send keyed requests without pause while the proxy between the
// ingress and PostgreSQL resets every connection, refuses new ones, and heals,
// several times. Every 202 must name committed rows with the keys sent; every
// request without a 202 got an error; retrying those with the same keys
// must leave exactly one row per key.
func TestADatabaseLostMidRequestNeverAnswers202ForWhatIsNotCommitted(t *testing.T) {
	t.Parallel()
	f, p := proxied(t, func(o *ingress.Options) { o.BatchWait = time.Millisecond })
	type sent struct {
		keys []string
		a    answer
	}
	var mu sync.Mutex
	var all []sent
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				keys := []string{fmt.Sprintf("c%d-r%d-a", c, i), fmt.Sprintf("c%d-r%d-b", c, i)}
				body := fmt.Sprintf("{\"payload\": \"%s\", \"key\": %q}\n{\"payload\": \"%s\", \"key\": %q}", keys[0], keys[0], keys[1], keys[1])
				a := f.post("application/x-ndjson", "?stage=a", body)
				mu.Lock()
				all = append(all, sent{keys, a})
				mu.Unlock()
				if a.code == 503 {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	acceptedSoFar := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, s := range all {
			if s.a.code == 202 {
				n++
			}
		}
		return n
	}
	// Each fault strikes while requests are being accepted: after a failure
	// the ingress refuses at once for a second, so a healthy phase must
	// outlast that before the next fault can find commits in flight.
	for range 4 {
		before := acceptedSoFar()
		waitFor(t, "requests accepted again", func() bool { return acceptedSoFar() > before+5 })
		p.Refuse()
		p.ResetAll()
		time.Sleep(150 * time.Millisecond)
		p.Heal()
	}
	before := acceptedSoFar()
	waitFor(t, "requests accepted after the last fault", func() bool { return acceptedSoFar() > before })
	close(stop)
	wg.Wait()

	byKey := map[string]int64{}
	for _, r := range f.rows() {
		if r.Key == nil || *r.Key != r.Payload {
			t.Fatalf("row %+v: want its key to be its payload", r)
		}
		byKey[*r.Key] = r.ID
	}
	accepted, refused, unknown := 0, 0, 0
	var retry []sent
	for _, s := range all {
		switch s.a.code {
		case 202:
			accepted++
			for i, k := range s.keys {
				if id, ok := byKey[k]; !ok || id != s.a.ids[i] {
					t.Errorf("202 named id %d for key %s, but the queue has %d (present: %v)", s.a.ids[i], k, id, ok)
				}
			}
		case 503:
			refused++
			if strings.Contains(s.a.err, "may or may not be committed") {
				unknown++
			}
			if s.a.err == "" || s.a.retry == "" {
				t.Errorf("503 without a reason or Retry-After: %+v", s.a)
			}
			retry = append(retry, s)
		default:
			t.Errorf("answer %+v; want 202 or 503", s.a)
		}
	}
	if accepted == 0 || refused == 0 {
		t.Fatalf("%d accepted, %d refused: the faults did not bite or nothing got through", accepted, refused)
	}
	t.Logf("%d requests accepted, %d refused during the faults (%d of them cut off mid-request: outcome unknown)", accepted, refused, unknown)
	for _, s := range retry {
		body := fmt.Sprintf("{\"payload\": \"%s\", \"key\": %q}\n{\"payload\": \"%s\", \"key\": %q}", s.keys[0], s.keys[0], s.keys[1], s.keys[1])
		var a answer
		waitFor(t, "a retry accepted", func() bool {
			a = f.post("application/x-ndjson", "?stage=a", body)
			return a.code == 202
		})
	}
	var rows, keys int
	if err := f.conn.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT dedup_key) FROM pepsi.queue`).Scan(&rows, &keys); err != nil {
		t.Fatal(err)
	}
	if rows != 2*len(all) || keys != rows {
		t.Errorf("%d rows with %d distinct keys after the retries; want %d of each (no duplicate, nothing lost)", rows, keys, 2*len(all))
	}
}

// Proves: a database that takes no writes (a standby the address still
// leads to during a failover, or default_transaction_read_only, as here)
// gets 503 with Retry-After, saying nothing was committed, not a 500:
// clients retry a 503 and take a 500 for a bug of theirs or ours. Found
// from outside: ALTER SYSTEM SET default_transaction_read_only = on under a
// running pepsi-ingress answered "500 commit failed; see pepsi-ingress's
// log".
func TestAReadOnlyDatabaseGets503AndRetryAfter(t *testing.T) {
	t.Parallel()
	db := pgtest.NewMigrated(t)
	sep := "?"
	if strings.Contains(db, "?") {
		sep = "&"
	}
	f := start(t, db+sep+"default_transaction_read_only=on", nil)
	f.conn = pgtest.Connect(t, db)
	a := f.post("application/json", "?stage=a", `{"payload": "x", "key": "x"}`)
	if a.code != 503 || a.retry != "1" {
		t.Errorf("database read-only: %+v; want 503 with Retry-After: 1", a)
	}
	if !strings.Contains(a.err, "read-only") || !strings.Contains(a.err, "nothing of this request was committed") {
		t.Errorf("database read-only: %q; want it to say so, and that nothing was committed", a.err)
	}
	if n := f.count(); n != 0 {
		t.Errorf("%d rows; want none", n)
	}
	if res, err := http.Get(f.http.URL + "/healthz"); err != nil || res.StatusCode != 503 {
		t.Errorf("/healthz with the database read-only: %v %v; want 503", res.StatusCode, err)
	}
}

// TestALockWaitThatRunsOutIsA503ThatCommittedNothing: a keyed request waits
// for the lock of its order key's bucket, which another producer's open
// transaction holds, until its session's lock_timeout (LockWait; here the
// database's shorter one, which store.BoundLockWaits keeps) ends the wait.
// The answer is a 503 with Retry-After that says nothing was committed and
// why; the database is not counted unreachable, so the next request is
// taken at once. Before, the error fell to "commit failed" (500, each
// request tried alone), and without a lock_timeout the try's timeout
// answered "the database is unreachable; the request may or may not be
// committed" and refused every request for a second.
func TestALockWaitThatRunsOutIsA503ThatCommittedNothing(t *testing.T) {
	t.Parallel()
	heldUpKeyedRequest(t, "lock_timeout", "lock another session holds")
}

// TestAnInsertTheDatabaseCancelsIsA503ThatCommittedNothing: a statement
// the database cancels (57014: here its statement_timeout, while the insert
// waits for an order key's lock another transaction holds) committed
// nothing, and the database answers: the request is told so (503, Retry-After),
// and the next request is taken at once. Before, class 57 was taken for an
// outage: "the database is unreachable; the request may or may not be
// committed", and every request was refused for a second.
func TestAnInsertTheDatabaseCancelsIsA503ThatCommittedNothing(t *testing.T) {
	t.Parallel()
	heldUpKeyedRequest(t, "statement_timeout", "canceled")
}

// TestABatchTheDatabaseCancelsIsNotTriedRequestByRequest: a batch of two
// requests held up behind another transaction's order key until the
// database cancels it (57014, its statement_timeout) is answered 503 as a
// whole, as a lock wait that ran out (55P03) is, in one try. Before, its
// requests were then tried one at a time, and each waited behind the same
// holder for the whole statement_timeout again, the committer with it.
// One committer, busy with a first held-up request while the two arrive,
// makes them share the next batch.
func TestABatchTheDatabaseCancelsIsNotTriedRequestByRequest(t *testing.T) {
	t.Parallel()
	db := pgtest.NewMigrated(t)
	ctx := context.Background()
	other := pgtest.Connect(t, db)
	if _, err := other.Exec(ctx, `DO $$ BEGIN
		EXECUTE format('ALTER DATABASE %I SET statement_timeout = ''1s''', current_database()); END $$`); err != nil {
		t.Fatal(err)
	}
	f := start(t, db, func(o *ingress.Options) { o.Committers = 1 })
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // rolled back below
	if _, err := tx.Exec(ctx, `INSERT INTO pepsi.queue (stage, payload, order_key) VALUES ('a', 'import', 'acct-9')`); err != nil {
		t.Fatal(err)
	}
	answers := make(chan answer, 3)
	post := func(p string) {
		answers <- f.post("application/x-ndjson", "?stage=a", fmt.Sprintf(`{"payload": %q, "order_key": "acct-9"}`, p))
	}
	go post("first")
	waitFor(t, "the first request's batch to wait for acct-9", func() bool {
		var n int
		if err := f.conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	go post("second")
	go post("third")
	for range 3 {
		if a := <-answers; a.code != http.StatusServiceUnavailable || a.retry != "1" || !strings.Contains(a.err, "canceled") ||
			!strings.Contains(a.err, "nothing of this request was committed") {
			t.Errorf("request held up until canceled: %+v; want 503, Retry-After 1, canceled, nothing committed", a)
		}
	}
	if tries := f.metric("pepsi_ingress_commit_seconds_count"); tries != 2 {
		t.Errorf("%v tries of a transaction; want 2 (the first request's batch, then the other two's; more: they were tried alone)", tries)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := f.count(); n != 0 {
		t.Errorf("%d rows; want none", n)
	}
}

// heldUpKeyedRequest posts a keyed request behind another transaction's
// insert of its order key, on a database whose setting (lock_timeout or
// statement_timeout) is 300 ms, and wants a 503 with Retry-After whose error
// holds says and that nothing was committed; then a request after it is
// taken, and only that one is in the queue.
func heldUpKeyedRequest(t *testing.T, setting, says string) {
	t.Helper()
	db := pgtest.NewMigrated(t)
	ctx := context.Background()
	other := pgtest.Connect(t, db)
	if _, err := other.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN
		EXECUTE format('ALTER DATABASE %%I SET %s = ''300ms''', current_database()); END $$`, setting)); err != nil {
		t.Fatal(err)
	}
	f := start(t, db, nil)
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // rolled back below
	if _, err := tx.Exec(ctx, `INSERT INTO pepsi.queue (stage, payload, order_key) VALUES ('a', 'import', 'acct-9')`); err != nil {
		t.Fatal(err)
	}
	a := f.post("application/x-ndjson", "?stage=a", `{"payload": "x", "order_key": "acct-9"}`)
	if a.code != http.StatusServiceUnavailable || a.retry != "1" || !strings.Contains(a.err, says) ||
		!strings.Contains(a.err, "nothing of this request was committed") {
		t.Errorf("keyed request held up (%s): %+v; want 503, Retry-After 1, %q, nothing committed", setting, a, says)
	}
	if a := f.post("application/x-ndjson", "?stage=a", `{"payload": "y"}`); a.code != http.StatusAccepted {
		t.Errorf("the next request: %+v; want 202 (the database answers)", a)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := f.count(); n != 1 {
		t.Errorf("%d rows; want 1 (the request after)", n)
	}
}
