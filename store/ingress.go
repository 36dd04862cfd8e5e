package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The statements of pepsi-ingress. Inserts go through pepsi.queue's
// triggers (they notify the dispatcher and take the producer lock:
// docs/protocol.md) and take ingress_id from the identity.

// insertRows inserts rows as pending in one statement, in order; a row whose key
// is already in the queue is not inserted. It returns what was inserted (the
// identity hands out ids in the order of the SELECT, so the ids, sorted, follow
// the order of the rows inserted) and, for keys that were not inserted, the id
// of the row that holds the key as far as this statement's snapshot sees.
// Traceparents are $6 ("" for none), not_before times $7 (NULL for none:
// scheduledStatus). Order keys ($5, "" for none) are locked first, in the order of their
// buckets (orderKeysLocked).
const insertRows = `WITH input AS (
	SELECT * FROM unnest($1::text[], $2::bytea[], $3::text[], $4::text[], $5::text[], $6::text[], $7::timestamptz[])
		WITH ORDINALITY AS u(stage, payload, state, key, order_key, traceparent, not_before, n)
), ins AS (
	INSERT INTO pepsi.queue (stage, payload, state, dedup_key, order_key, traceparent, status, timeout)
	SELECT stage, payload, coalesce(nullif(state, '')::jsonb, '{}'), key, nullif(order_key, ''), nullif(traceparent, ''),
		` + scheduledStatus + ` FROM input
	WHERE ` + orderKeysLocked + ` ORDER BY n
	ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
	RETURNING ingress_id, dedup_key, status
)
SELECT ingress_id, dedup_key, true, ` + scheduledNotify + ` FROM ins
UNION ALL
SELECT q.ingress_id, q.dedup_key, false, false FROM pepsi.queue q
WHERE q.dedup_key = ANY($4::text[]) AND q.dedup_key IS NOT NULL`

// scheduledStatus is the status and timeout of a row inserted from an input
// with a not_before column: paused until then (a scheduled message), or
// pending when it has none or it is not ahead of the server's clock. A keyed
// row the insert trigger blocks behind its key keeps that timeout for when it
// becomes its key's head (schema 12).
const scheduledStatus = `CASE WHEN not_before > now() THEN 'paused' ELSE 'pending' END,
		CASE WHEN not_before > now() THEN not_before END`

// scheduledNotify, a column of an insert's answer (from ins, with its
// status), notifies ingress for a row inserted paused, and is true for it.
// Such a row wakes the dispatcher always, not only while it waits (as the
// insert trigger's notifications do): a busy dispatcher learns of paused
// rows only from its own writes and its wakes, so without the notification a
// scheduled message could wait for the heartbeat (POLL_INTERVAL) past its
// time. Notifications with the same payload in one transaction are one,
// delivered at commit.
const scheduledNotify = `CASE WHEN ins.status = 'paused' THEN pg_notify('ingress', '') IS NOT NULL ELSE false END`

// Keyed batches take advisory locks before they insert. Two transactions
// that insert the same keys in different orders would otherwise deadlock on
// the unique index (each waiting for a key the other inserted first, until
// the server's deadlock_timeout ends one), and the rows cannot simply be
// inserted in key order: the ids must follow the order given, and drawing
// them ahead with nextval would need a grant on the identity's sequence
// beyond INSERT and SELECT. So each keyed transaction first takes the gate
// (shared; exclusive for a batch of more than keyLocksMax keys, so that no
// transaction holds more locks than the server's lock table allows), then
// one lock per key, in the order of the keys' hashes. A transaction then
// never waits on the index for a key another ingress transaction holds (it
// would have waited on that key's lock first), and its waits on locks all go
// up one order: no cycle of waits can form. The locks are pairs of int4 keys
// (classes "pekg" and "peky"), a space apart from the bigint keys of
// pepsi.queue's triggers and migrations.
const (
	lockKeyGateShared = `SELECT pg_advisory_xact_lock_shared(1885694823, 0)`
	lockKeyGate       = `SELECT pg_advisory_xact_lock(1885694823, 0)`
	lockKeys          = `SELECT count(pg_advisory_xact_lock(1885694841, h))
FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest($1::text[]) AS k WHERE k IS NOT NULL ORDER BY h) s`
)

// orderKeysLocked is a condition, true, that takes the locks of the order
// keys of the statement's rows (column order_key of its CTE input, "" for
// none), in the order of their buckets, before
// the statement it gates inserts a row: a condition without a column is
// PostgreSQL's one-time filter, checked before the first row is read. The
// insert trigger (schema 12) takes a keyed row's lock, waiting, as it
// inserts the row; in the order of the rows, two statements that insert the
// rows of two keys in opposite orders would deadlock, each holding one key and
// waiting for the other (until the server's deadlock_timeout aborted one).
// Taken first in one order for all, the trigger finds each lock held, and the
// rows keep the order given, so their ids do too (and a key's rows keep it).
// A transaction holds at most 1024 such locks, one per bucket.
const orderKeysLocked = `(SELECT count(pg_advisory_xact_lock(1885696107, b))
	FROM (SELECT DISTINCT pepsi.order_bucket(order_key) AS b FROM input
	      WHERE order_key <> '' ORDER BY b) s) >= 0`

// producerSessionSQL sets what a producer's session (pepsi-ingress,
// pepsi-queue) needs whatever the server's or the role's defaults:
// default_transaction_isolation read committed, since the order-key trigger
// decides whether a keyed message waits behind its key from what its
// queries see, which at REPEATABLE READ or SERIALIZABLE is the
// transaction's snapshot, taken before the key's lock (a head finished
// since still looks unfinished), and so refuses such an insert (schema 36);
// and synchronous_commit at least on, since a producer answers its ids
// (pepsi-ingress's 202, which is never lost) or prints them as committed
// once its COMMIT returns: with off (or local) the commit returns before
// its WAL is flushed (here), and a crash of the server loses the rows it
// answered. A stronger setting (remote_write, remote_apply) is kept. Set
// after connecting, not as startup parameters, which a connection pooler
// such as PgBouncer refuses unless told to ignore them.
const producerSessionSQL = `SELECT set_config('default_transaction_isolation', 'read committed', false),
       CASE WHEN current_setting('synchronous_commit') IN ('off', 'local')
            THEN set_config('synchronous_commit', 'on', false) END`

// ProducerSession sets a producer's session up (see producerSessionSQL):
// call it once conn is connected (pgx's AfterConnect).
func ProducerSession(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, producerSessionSQL); err != nil {
		return fmt.Errorf("set the session up: %w", err)
	}
	return nil
}

// keyLocksMax bounds the key locks of one transaction; a batch with more
// keys takes the gate alone, exclusively.
const keyLocksMax = 256

// lookupKeys finds the rows that hold keys. In a statement of its own it sees
// rows that a concurrent transaction committed while insertRows waited for it.
const lookupKeys = `SELECT dedup_key, ingress_id FROM pepsi.queue WHERE dedup_key = ANY($1::text[])`

// pendingCounts counts the pending rows of each stage, up to limit each: the
// partial pending index answers it, and the limit bounds its cost.
const pendingCounts = `SELECT s.stage, (SELECT count(*) FROM (
	SELECT 1 FROM pepsi.queue q WHERE q.stage = s.stage AND q.status = 'pending' LIMIT $2) p)
FROM unnest($1::text[]) AS s(stage)`

// IngressRow is one message as InsertIngress takes it.
type IngressRow struct {
	Stage   string
	Payload []byte
	State   string  // "" means {}
	Key     *string // nil: no key
	// OrderKey is the message's order key, "" for none: a row whose key has
	// an unfinished message is inserted blocked behind it
	// (docs/protocol.md, "Ordering per key").
	OrderKey string
	// TraceParent is the message's W3C traceparent, "" for none (the
	// claim of its first pass gives it one).
	TraceParent string
	// NotBefore, when not zero, schedules the message: it is inserted
	// paused until then, so it is first claimed at that time (or pending, if
	// that is not ahead of the server's clock).
	NotBefore time.Time
}

// ingressFound is a row of insertRows' answer: its id and its key, if any,
// and whether this insert inserted it.
type ingressFound struct {
	ID       int64
	Key      *string
	Inserted bool
}

// ErrKeyVanished reports that a key's row was deleted between the insert that
// found it and the look-up of its id. Nothing was committed: the insert may
// be tried again.
var ErrKeyVanished = errors.New("a key's row was deleted while it was looked up")

// ErrInsertAnswer marks an answer of the database that contradicts what the
// insert statement promises: a bug. Nothing was committed.
var ErrInsertAnswer = errors.New("the insert answered what it cannot (a bug)")

// InsertIngress inserts rows as pending messages in one transaction, in
// order, but for a row whose key is in the queue already, and returns each
// row's id: the one it was given, or the one of the row that holds its key.
// Each key may stand in rows once.
//
// Rows without keys need one statement, its own transaction. Rows with keys
// are inserted in a transaction (BEGIN, the key locks and the insert in one
// round trip), then the keys the insert did not see are looked up, and the
// ids checked, before it commits: it must not be given a transaction, and on
// a pool it takes one connection for it.
func (s *PG) InsertIngress(ctx context.Context, rows []IngressRow) ([]int64, error) {
	cols := ingressColumnsOf(rows)
	scan := func(r pgx.CollectableRow) (ingressFound, error) {
		var f ingressFound
		var scheduled bool // the notification is what matters
		err := r.Scan(&f.ID, &f.Key, &f.Inserted, &scheduled)
		return f, err
	}
	if !cols.keyed {
		got, err := collect(ctx, s.db, "insert", scan, insertRows, cols.args()...)
		if err != nil {
			return nil, err
		}
		return assign(rows, got, nil)
	}
	db := s.db
	if pool, ok := db.(*pgxpool.Pool); ok {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return nil, fmt.Errorf("insert: connect: %w", err)
		}
		// A connection left inside a transaction (a failed ROLLBACK) is
		// closed on release, not reused: pgxpool keeps only idle ones.
		defer c.Release()
		db = c
	}
	ids, err := insertKeyed(ctx, db, rows, scan, cols)
	if err != nil {
		db.Exec(ctx, rollbackSQL) //nolint:errcheck // the error that matters is err
		return nil, err
	}
	tag, err := db.Exec(ctx, commitSQL)
	if err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	if tag.String() != "COMMIT" {
		return nil, fmt.Errorf("commit: the server rolled the transaction back (%s)", tag)
	}
	return ids, nil
}

// ingressColumns are rows as insertRows takes them, a column each, and
// whether any row has a key.
type ingressColumns struct {
	stages    []string
	payloads  [][]byte
	states    []string
	keys      []*string
	orderKeys []string
	traces    []string
	notBefore []pgtype.Timestamptz
	keyed     bool
}

func ingressColumnsOf(rows []IngressRow) ingressColumns {
	n := len(rows)
	c := ingressColumns{stages: make([]string, n), payloads: make([][]byte, n), states: make([]string, n),
		keys: make([]*string, n), orderKeys: make([]string, n), traces: make([]string, n), notBefore: make([]pgtype.Timestamptz, n)}
	for i, r := range rows {
		c.stages[i], c.payloads[i], c.states[i], c.keys[i], c.orderKeys[i], c.traces[i] = r.Stage, r.Payload, r.State, r.Key, r.OrderKey, r.TraceParent
		c.notBefore[i] = orNull(r.NotBefore)
		c.keyed = c.keyed || r.Key != nil
	}
	return c
}

// orNull is t as a timestamptz parameter, NULL for the zero time (no
// not_before).
func orNull(t time.Time) pgtype.Timestamptz {
	return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()}
}

// args are insertRows' arguments.
func (c ingressColumns) args() []any {
	return []any{c.stages, c.payloads, c.states, c.keys, c.orderKeys, c.traces, c.notBefore}
}

// insertKeyed is InsertIngress of rows with keys up to its COMMIT, which it
// leaves to the caller (and the ROLLBACK when it fails).
func insertKeyed(ctx context.Context, db DB, rows []IngressRow, scan pgx.RowToFunc[ingressFound], cols ingressColumns) ([]int64, error) {
	b := &pgx.Batch{}
	b.Queue(beginSQL)
	queueKeyLocks(b, cols.keys)
	b.Queue(insertRows, cols.args()...)
	br := db.SendBatch(ctx, b)
	for range b.Len() - 1 {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return nil, fmt.Errorf("begin and lock the keys: %w", err)
		}
	}
	res, err := br.Query()
	var got []ingressFound
	if err == nil {
		got, err = pgx.CollectRows(res, scan)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("insert: %w", err)
	}
	lookedUp, err := lookUpMissing(ctx, db, got, cols.keys)
	if err != nil {
		return nil, err
	}
	return assign(rows, got, lookedUp)
}

// assign gives each row its id: an inserted row the next of the inserted ids
// in order (the identity hands them out in the order of the rows), a row whose
// key was there already the id of the row holding it.
func assign(rows []IngressRow, got []ingressFound, lookedUp map[string]int64) ([]int64, error) {
	var inserted []ingressFound
	existing := map[string]int64{}
	for _, f := range got {
		if f.Inserted {
			inserted = append(inserted, f)
		} else {
			existing[*f.Key] = f.ID
		}
	}
	slices.SortFunc(inserted, func(a, b ingressFound) int { return cmp.Compare(a.ID, b.ID) })
	insertedKey := map[string]bool{}
	for _, f := range inserted {
		if f.Key != nil {
			insertedKey[*f.Key] = true
		}
	}
	ids := make([]int64, len(rows))
	next := 0
	for i, r := range rows {
		if r.Key == nil || insertedKey[*r.Key] {
			if next == len(inserted) {
				return nil, fmt.Errorf("insert answered %d rows for more rows than that: %w", len(inserted), ErrInsertAnswer)
			}
			f := inserted[next]
			next++
			if (f.Key == nil) != (r.Key == nil) || f.Key != nil && *f.Key != *r.Key {
				return nil, fmt.Errorf("insert answered its rows out of order at row %d: %w", i+1, ErrInsertAnswer)
			}
			ids[i] = f.ID
			continue
		}
		id, ok := existing[*r.Key]
		if !ok {
			id, ok = lookedUp[*r.Key]
		}
		if !ok {
			return nil, ErrKeyVanished
		}
		ids[i] = id
	}
	if next != len(inserted) {
		return nil, fmt.Errorf("insert answered %d rows, %d expected: %w", len(inserted), next, ErrInsertAnswer)
	}
	return ids, nil
}

// queueKeyLocks queues on b the advisory locks of a keyed transaction: the
// gate shared and a lock per key, or the gate alone, exclusively, for more
// than keyLocksMax keys.
func queueKeyLocks(b *pgx.Batch, keys []*string) {
	n := 0
	for _, k := range keys {
		if k != nil {
			n++
		}
	}
	if n > keyLocksMax {
		b.Queue(lockKeyGate)
		return
	}
	b.Queue(lockKeyGateShared)
	b.Queue(lockKeys, keys)
}

// lookUpMissing finds the ids of the keys that the insert neither inserted
// nor saw (rows committed while it waited for them); nil when there are none.
func lookUpMissing(ctx context.Context, db DB, got []ingressFound, keys []*string) (map[string]int64, error) {
	seen := map[string]bool{}
	for _, f := range got {
		if f.Key != nil {
			seen[*f.Key] = true
		}
	}
	var missing []string
	for _, k := range keys {
		if k != nil && !seen[*k] {
			missing = append(missing, *k)
		}
	}
	if len(missing) == 0 {
		return nil, nil
	}
	return collectMap(ctx, db, "look up keys", lookupKeys, missing)
}

// CountPending counts the pending rows of each stage, at most limit each.
func (s *PG) CountPending(ctx context.Context, stages []string, limit int64) (map[string]int64, error) {
	return collectMap(ctx, s.db, "count pending", pendingCounts, stages, limit)
}

// schemaVersionSQL is the version of the schema the database is at: the
// highest migration applied.
const schemaVersionSQL = `SELECT coalesce((SELECT max(version) FROM pepsi.schema_migrations), 0)`

// SchemaVersion reads the version of the PEPSI schema the database is at, so
// that a program can refuse to serve one older than it needs. Unlike Version,
// it fails when the schema has no version table at all.
func (s *PG) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	if err := s.db.QueryRow(ctx, schemaVersionSQL).Scan(&v); err != nil {
		return 0, fmt.Errorf("schema version: %w", err)
	}
	return v, nil
}

// beginSQL, commitSQL and rollbackSQL are a keyed insert's transaction
// control (see InsertIngress): it stays open until the ids are assigned, then
// commits, or rolls back when they cannot be.
const (
	beginSQL    = "BEGIN"
	commitSQL   = "COMMIT"
	rollbackSQL = "ROLLBACK"
)
