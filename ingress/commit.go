package ingress

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pepsi-pipeline/pepsi/internal/msgjson"
	"github.com/pepsi-pipeline/pepsi/store"
)

// Defaults of the group commit.
const (
	// BatchMaxDefault bounds the messages of one transaction (several requests'
	// worth); a request with more commits alone.
	BatchMaxDefault = 1000
	// BatchWaitDefault is the longest a request waits for others to share its
	// transaction.
	BatchWaitDefault = 2 * time.Millisecond
	// BatchIdleDefault: with no other transaction in flight, a batch commits
	// at once with what has arrived; the database then waits for nothing but
	// this batch, and any wait would only add to every request's latency.
	// While another commits, the batch gathers until that one ends, so under
	// load batches fill up by themselves. (A positive idle time has the batch
	// wait until no request has arrived for that long: fewer, larger
	// transactions at a low rate, at the cost of latency. 200 µs, the default
	// before, made 64 keep-alive clients wait out the idle time of each
	// batch: 24,547 messages/s against 40,370 at once, docs/performance.md.)
	BatchIdleDefault time.Duration = 0
	// CommittersDefault is how many transactions may be in flight at once, each
	// on a connection of its own: while one commits, the next batch gathers.
	CommittersDefault = 2
	// attemptsMax bounds the tries of one batch whose failure is known to leave
	// nothing behind (a deadlock, a connection that failed before the statement
	// was sent, a key whose row vanished between insert and look-up).
	attemptsMax = 3
	// commitTimeout bounds one try of a batch.
	commitTimeout = 30 * time.Second
	// downFor is how long requests are refused at once (503) after the database
	// could not be reached, rather than each waiting for a connection to fail.
	downFor = time.Second
)

// LockWait bounds a statement's wait for a lock another session holds (an
// open transaction of a producer that inserted a message of the same order
// key's bucket, or the same key): the lock_timeout the pool's sessions get
// (store.BoundLockWaits), under commitTimeout by the dispatcher's rule
// (store.LockWaitUnder), so that the wait ends with the server's error
// (55P03), before any COMMIT, and the request is answered that nothing of
// it was committed, not with the try's timeout, whose outcome is unknown
// and which counts the database as unreachable.
var LockWait = store.LockWaitUnder(commitTimeout)

// request is one HTTP request's messages, waiting for their commit.
type request struct {
	msgs []msgjson.Message
	done chan outcome // buffered: the committer never waits for the handler
}

// outcome is a request's answer: its ids in order, or why not.
type outcome struct {
	ids []int64
	st  *Status
}

// committer commits the messages of concurrent requests together: one
// transaction per batch, at most batchMax messages, gathered for at most wait.
// Every request in a batch gets the batch's outcome; a batch that fails for one
// request's data is retried request by request, so one bad request fails
// alone. Nothing is ever half-committed: a batch is one transaction.
type committer struct {
	pool     *pgxpool.Pool
	in       chan *request
	batchMax int
	wait     time.Duration
	idle     time.Duration // 0: a batch commits as soon as no other is in flight
	m        *metrics
	log      *slog.Logger

	gather sync.Mutex // one committer gathers at a time, so batches fill up
	carry  *request   // a request that did not fit the last batch; under gather

	downUntil atomic.Int64 // unix nanoseconds: until then the database counts as unreachable
	inFlight  atomic.Int32 // batches being committed
	// freed wakes the gathering batch when a commit ends (one wake-up is
	// enough: it looks at inFlight).
	freed chan struct{}
	wg    sync.WaitGroup

	closing sync.RWMutex // held for reading while handing a request over
	closed  bool         // under closing: no more requests are taken
}

func newCommitter(pool *pgxpool.Pool, n, batchMax int, wait, idle time.Duration, m *metrics, log *slog.Logger) *committer {
	c := &committer{pool: pool, in: make(chan *request, n*batchMax), batchMax: batchMax, wait: wait, idle: idle, m: m, log: log,
		freed: make(chan struct{}, 1)}
	c.wg.Add(n)
	for range n {
		go c.work()
	}
	return c
}

// commit commits msgs (all of them or none) and returns their ids in order.
// It waits for the commit even if the client has gone: a request that was
// handed over is answered only by its own commit's outcome.
func (c *committer) commit(msgs []msgjson.Message) ([]int64, *Status) {
	if c.down() {
		return nil, unreachable()
	}
	r := &request{msgs: msgs, done: make(chan outcome, 1)}
	c.closing.RLock()
	if c.closed {
		c.closing.RUnlock()
		return nil, &Status{Code: http.StatusServiceUnavailable, Msg: "pepsi-ingress is shutting down; nothing of this request was committed", RetryAfter: 1}
	}
	c.in <- r
	c.closing.RUnlock()
	o := <-r.done
	return o.ids, o.st
}

// close stops the committers once every request handed over is answered; a
// commit called later (a request still being read when the shutdown grace ran
// out) is answered 503.
func (c *committer) close() {
	c.closing.Lock()
	c.closed = true
	close(c.in)
	c.closing.Unlock()
	c.wg.Wait()
}

func (c *committer) down() bool { return time.Now().UnixNano() < c.downUntil.Load() }

func unreachable() *Status {
	return &Status{Code: http.StatusServiceUnavailable, Msg: "the database is unreachable; nothing of this request was committed", RetryAfter: 1}
}

func (c *committer) work() {
	defer c.wg.Done()
	for {
		batch, ok := c.next()
		if !ok {
			return
		}
		c.inFlight.Add(1)
		c.commitBatch(batch)
		c.inFlight.Add(-1)
		select {
		case c.freed <- struct{}{}:
		default:
		}
	}
}

// next gathers a batch: the first request, and whatever is waiting behind it,
// up to batchMax messages. With no other batch being committed it returns at
// once (with idle: once nothing has arrived for idle); while another is, it
// gathers until that one's commit ends, since it could not commit sooner, or
// until wait has passed since it began. It returns false once the committer
// is closed.
func (c *committer) next() ([]*request, bool) {
	c.gather.Lock()
	defer c.gather.Unlock()
	first := c.carry
	c.carry = nil
	if first == nil {
		r, ok := <-c.in
		if !ok {
			return nil, false
		}
		first = r
	}
	batch, n := []*request{first}, len(first.msgs)
	// add takes r into the batch, or keeps it for the next one when it does
	// not fit; it says whether to go on gathering.
	add := func(r *request, ok bool) bool {
		if !ok {
			return false
		}
		if n+len(r.msgs) > c.batchMax {
			c.carry = r
			return false
		}
		batch, n = append(batch, r), n+len(r.msgs)
		return n < c.batchMax
	}
	// drain takes whatever is waiting already; it says whether to go on.
	drain := func() bool {
		for {
			select {
			case r, ok := <-c.in:
				if !add(r, ok) {
					return false
				}
			default:
				return true
			}
		}
	}
	if !drain() || c.wait <= 0 || (c.idle == 0 && c.inFlight.Load() == 0) {
		return batch, true
	}
	timer := time.NewTimer(c.wait)
	defer timer.Stop()
	var quiet <-chan time.Time // with idle: fires once nothing has arrived for idle
	var idleTimer *time.Timer
	if c.idle > 0 && c.idle < c.wait {
		idleTimer = time.NewTimer(c.idle)
		defer idleTimer.Stop()
		quiet = idleTimer.C
	}
	for more := true; more; {
		select {
		case r, ok := <-c.in:
			more = add(r, ok)
			if idleTimer != nil {
				idleTimer.Reset(c.idle)
			}
		case <-timer.C:
			more = false
		case <-c.freed:
			// A commit ended (perhaps one before this batch began: the
			// count says whether another is still in flight).
			if c.idle == 0 && c.inFlight.Load() == 0 {
				drain()
				more = false
			}
		case <-quiet:
			// While another batch commits, this one could not commit sooner
			// than that one's end: it goes on gathering.
			more = c.inFlight.Load() > 0
			idleTimer.Reset(c.idle)
		}
	}
	return batch, true
}

// commitBatch commits batch and answers each of its requests.
func (c *committer) commitBatch(batch []*request) {
	rows, pos := flatten(batch)
	ids, st, perRequest := c.insert(rows)
	if st != nil && perRequest && len(batch) > 1 {
		for _, r := range batch {
			c.commitBatch([]*request{r})
		}
		return
	}
	if st == nil {
		c.m.batchMessages.Observe(float64(len(rows)))
		c.m.batchRequests.Observe(float64(len(batch)))
	}
	for i, r := range batch {
		if st != nil {
			r.done <- outcome{st: st}
			continue
		}
		out := make([]int64, len(r.msgs))
		for j, p := range pos[i] {
			out[j] = ids[p]
		}
		r.done <- outcome{ids: out}
	}
}

// flatten lists the rows to insert for batch, each key once (a key repeated
// across requests is inserted for the first and answered to all), and for each
// request, the row of each of its messages.
func flatten(batch []*request) (rows []store.IngressRow, pos [][]int) {
	byKey := map[string]int{}
	pos = make([][]int, len(batch))
	for i, r := range batch {
		pos[i] = make([]int, len(r.msgs))
		for j, m := range r.msgs {
			if m.Key != "" {
				if p, ok := byKey[m.Key]; ok {
					pos[i][j] = p
					continue
				}
				byKey[m.Key] = len(rows)
			}
			rw := store.IngressRow{Stage: m.Stage, Payload: m.Payload, State: string(m.State), OrderKey: m.OrderKey, TraceParent: m.TraceParent, NotBefore: m.NotBefore}
			if m.Key != "" {
				rw.Key = &m.Key
			}
			pos[i][j] = len(rows)
			rows = append(rows, rw)
		}
	}
	return rows, pos
}

// insert commits rows in one transaction, trying again what is known to have
// left nothing behind. perRequest says that the failure may be one request's
// data, so the requests of a batch should be tried alone.
func (c *committer) insert(rows []store.IngressRow) (ids []int64, st *Status, perRequest bool) {
	for attempt := 1; ; attempt++ {
		start := time.Now()
		ids, err := c.try(rows)
		c.m.commitSeconds.Observe(time.Since(start).Seconds())
		if err == nil {
			return ids, nil, false
		}
		var pgErr *pgconn.PgError
		isPg := errors.As(err, &pgErr)
		retry := errors.Is(err, store.ErrKeyVanished) || pgconn.SafeToRetry(err) ||
			isPg && (pgErr.Code == "40P01" || pgErr.Code == "40001")
		if retry && attempt < attemptsMax {
			c.log.Warn("commit failed; trying again", "rows", len(rows), "attempt", attempt, "err", err)
			time.Sleep(time.Duration(attempt) * 10 * time.Millisecond)
			continue
		}
		switch {
		case errors.Is(err, store.ErrInsertAnswer), errors.Is(err, store.ErrKeyVanished):
		case isPg && (len(pgErr.Code) == 5 && (pgErr.Code[:2] == "22" || pgErr.Code[:2] == "23" || pgErr.Code[:2] == "54")):
			c.log.Warn("the database refused a batch", "rows", len(rows), "err", err)
			return nil, &Status{Code: http.StatusBadRequest, Msg: "the database refused a message: " + pgErr.Message}, true
		case isPg && pgErr.Code == "55P03":
			// lock_not_available: a lock wait ran out (LockWait). The
			// database answers; the requests may pass once the holder ends.
			// Not tried alone: each request waiting behind the holder would
			// wait LockWait again, the committer with it. The requests of a
			// batch commit together, so the message names the batch's keys,
			// not necessarily this request's.
			c.log.Warn("a lock another session holds was not granted in time; answering 503", "rows", len(rows), "err", err)
			return nil, &Status{Code: http.StatusServiceUnavailable, RetryAfter: 1,
				Msg: "waited too long for a lock another session holds (an open transaction that inserted a message of the same order key's bucket or the same key as a message of this request, or of another request committed together with it); nothing of this request was committed"}, false
		case store.Canceled(err):
			// query_canceled: a statement_timeout of the role or the
			// database, or a cancel request, ended a statement before the
			// COMMIT (our own cancel surfaces as a context error, not as
			// this). The database answers. Not tried alone, as for 55P03:
			// the statement most often waited for a lock another session
			// holds, and each request waiting behind the holder would wait
			// its whole timeout again, the committer with it. The requests
			// of a batch commit together, so the cancel was the batch's,
			// not necessarily this request's.
			c.log.Warn("the database canceled the insert; answering 503", "rows", len(rows), "err", err)
			return nil, &Status{Code: http.StatusServiceUnavailable, RetryAfter: 1,
				Msg: "the database canceled the insert of this request, or of another request committed together with it (a statement_timeout, or a lock wait ended by a cancel); nothing of this request was committed"}, false
		case store.ReadOnly(err):
			// read_only_sql_transaction: the server takes no writes, a standby
			// (a failover under way, the address not yet moved to the new
			// primary) or default_transaction_read_only. It answered an ERROR
			// before the COMMIT, so nothing committed; and it is the database's
			// state, not the request's, which a retry later may pass: 503, as
			// for a database that cannot be reached, not a 500 that clients
			// take for a bug and do not retry.
			c.log.Error("the database is read-only (a standby?); answering 503", "rows", len(rows), "err", err)
			c.downUntil.Store(time.Now().Add(downFor).UnixNano())
			return nil, &Status{Code: http.StatusServiceUnavailable, RetryAfter: 1,
				Msg: "the database is read-only (a standby, or a failover under way); nothing of this request was committed"}, false
		case !isPg || pgErr.Code[:2] == "08" || pgErr.Code[:2] == "57" || pgErr.Code == "53300":
			c.log.Error("database unreachable; answering 503", "rows", len(rows), "err", err)
			c.downUntil.Store(time.Now().Add(downFor).UnixNano())
			if sentNothing(err) {
				return nil, unreachable(), false
			}
			return nil, &Status{Code: http.StatusServiceUnavailable, RetryAfter: 1,
				Msg: "the database is unreachable; the request may or may not be committed: retry it (with keys, a retry makes no duplicate)"}, false
		}
		c.log.Error("commit failed", "rows", len(rows), "err", err)
		return nil, &Status{Code: http.StatusInternalServerError, Msg: "commit failed; see pepsi-ingress's log"}, true
	}
}

// sentNothing says whether err is known to have come before anything of the
// transaction reached the server (a connection that could not be made, an
// error pgconn calls safe to retry): then nothing of it can have committed,
// and the client may be told so, rather than "may or may not".
func sentNothing(err error) bool {
	var ce *pgconn.ConnectError
	return pgconn.SafeToRetry(err) || errors.As(err, &ce)
}

// try is one transaction: insert, look up the keys already there, commit.
func (c *committer) try(rows []store.IngressRow) ([]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
	defer cancel()
	return store.On(c.pool).InsertIngress(ctx, rows)
}
