package store_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/internal/traceparent"
	"github.com/pepsi-pipeline/pepsi/store"
)

func TestMigrateIsIdempotent(t *testing.T) {
	t.Parallel()
	conn := pgtest.Connect(t, pgtest.NewDatabase(t))
	ctx := context.Background()
	applied, err := store.Migrate(ctx, conn)
	if err != nil {
		t.Fatalf("first migrate: %v", err)
	}
	if len(applied) == 0 || applied[len(applied)-1] != store.Latest() {
		t.Fatalf("first migrate applied %v, want up to version %d", applied, store.Latest())
	}
	again, err := store.Migrate(ctx, conn)
	if err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	if len(again) != 0 {
		t.Fatalf("second migrate applied %v, want nothing", again)
	}
	v, err := store.Version(ctx, conn)
	if err != nil || v != store.Latest() {
		t.Fatalf("Version = %d, %v; want %d", v, err, store.Latest())
	}
	for _, idx := range []string{"queue_pending", "queue_paused", "queue_running"} {
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT to_regclass('pepsi.'||$1) IS NOT NULL", idx).Scan(&ok); err != nil || !ok {
			t.Errorf("index pepsi.%s missing (err %v)", idx, err)
		}
	}
}

func TestInsertNotifiesIngressOncePerStatement(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	listener := pgtest.Listen(t, url)
	writer := pgtest.Connect(t, url)
	ctx := context.Background()
	pgtest.HoldGate(t, url) // a dispatcher waits for work: inserts notify
	if _, err := writer.Exec(ctx, "INSERT INTO pepsi.queue (stage) SELECT 'a' FROM generate_series(1, 100)"); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	n, err := listener.WaitForNotification(ctx)
	if err != nil || n.Channel != "ingress" {
		t.Fatalf("WaitForNotification = %v, %v; want one on ingress", n, err)
	}
	// A bulk insert of 100 rows must notify once: a second wait finds nothing.
	short, cancel := context.WithTimeout(ctx, 300e6)
	defer cancel()
	if n, err := listener.WaitForNotification(short); err == nil {
		t.Fatalf("second notification %v: a 100-row insert notified more than once", n)
	}
}

// Versions 7 (attempts) and 8 (dedup_key) add columns to a queue that may hold
// millions of rows: they must not rewrite the table (its relfilenode stays),
// and existing rows read the defaults.
func TestColumnMigrationsDoNotRewriteTheQueue(t *testing.T) {
	t.Parallel()
	conn := pgtest.Connect(t, pgtest.NewDatabase(t))
	ctx := context.Background()
	if _, err := store.MigrateTo(ctx, conn, 6); err != nil {
		t.Fatalf("migrate to 6: %v", err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO pepsi.queue (stage) SELECT 'a' FROM generate_series(1, 1000)"); err != nil {
		t.Fatal(err)
	}
	relfile := func() (n uint32) {
		t.Helper()
		if err := conn.QueryRow(ctx, "SELECT relfilenode FROM pg_class WHERE oid = 'pepsi.queue'::regclass").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := relfile()
	applied, err := store.Migrate(ctx, conn)
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if len(applied) == 0 || applied[0] != 7 {
		t.Fatalf("applied %v, want 7 onwards", applied)
	}
	if after := relfile(); after != before {
		t.Fatalf("pepsi.queue was rewritten by the migrations (relfilenode %d -> %d)", before, after)
	}
	var attempts, keys int
	if err := conn.QueryRow(ctx, "SELECT sum(attempts), count(dedup_key) FROM pepsi.queue").Scan(&attempts, &keys); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 || keys != 0 {
		t.Fatalf("old rows read attempts sum %d and %d keys, want 0 and 0", attempts, keys)
	}
}

// A dedup_key is unique among the rows that have one; rows without one are not
// constrained.
func TestDedupKeyIsUniqueWhereSet(t *testing.T) {
	t.Parallel()
	conn := pgtest.Connect(t, pgtest.NewMigrated(t))
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "INSERT INTO pepsi.queue (stage) VALUES ('a'), ('a')"); err != nil {
		t.Fatalf("two rows without a key: %v", err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO pepsi.queue (stage, dedup_key) VALUES ('a', 'k1')"); err != nil {
		t.Fatal(err)
	}
	tag, err := conn.Exec(ctx, "INSERT INTO pepsi.queue (stage, dedup_key) VALUES ('a', 'k1') ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING")
	if err != nil || tag.RowsAffected() != 0 {
		t.Fatalf("second insert of key k1: %v rows, err %v; want nothing inserted", tag.RowsAffected(), err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO pepsi.queue (stage, dedup_key) VALUES ('a', 'k1')"); err == nil {
		t.Fatal("a plain second insert of key k1 succeeded; want a unique violation")
	}
}

// Schemas 21 to 26 check a traceparent when an INSERT gives one or an UPDATE
// changes it, as schema 17's CHECK did (SQLSTATE 23514, naming
// queue_traceparent_check), and no longer at every update of its row: an
// update that leaves it alone does not run the check (a row whose value the
// check refuses, written before it, is updated).
func TestSchema21ChecksATraceparentWhenItIsWritten(t *testing.T) {
	t.Parallel()
	conn := migratedTo(t, 26) // schema 27 checks inserts only (TestSchema27FiresNoTriggerOnAQueueUpdate)
	ctx := t.Context()
	const good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	refused := func(what, sql string, args ...any) {
		t.Helper()
		_, err := conn.Exec(ctx, sql, args...)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != "queue_traceparent_check" {
			t.Errorf("%s: %v; want check_violation of queue_traceparent_check", what, err)
		}
	}
	refused("an insert of an upper-case traceparent", `INSERT INTO pepsi.queue (stage, traceparent) VALUES ('a', upper($1))`, good)
	refused("an insert of a traceparent of version 01", `INSERT INTO pepsi.queue (stage, traceparent) VALUES ('a', '01' || substr($1, 3))`, good)
	var id int64
	if err := conn.QueryRow(ctx, `INSERT INTO pepsi.queue (stage, traceparent) VALUES ('a', $1) RETURNING ingress_id`, good).Scan(&id); err != nil {
		t.Fatalf("an insert of a good traceparent: %v", err)
	}
	refused("an update to a bad traceparent", `UPDATE pepsi.queue SET traceparent = 'x' WHERE ingress_id = $1`, id)
	if _, err := conn.Exec(ctx, `UPDATE pepsi.queue SET traceparent = coalesce(traceparent, 'x'), status = 'running' WHERE ingress_id = $1`, id); err != nil {
		t.Errorf("an update that keeps a good traceparent (as a claim does): %v", err)
	}
	// A value the check refuses, written with the triggers off (as by a
	// restore of old data), does not fail the updates that leave it alone.
	if _, err := conn.Exec(ctx, `ALTER TABLE pepsi.queue DISABLE TRIGGER queue_traceparent_update;
		UPDATE pepsi.queue SET traceparent = 'legacy' WHERE ingress_id = `+strconv.FormatInt(id, 10)+`;
		ALTER TABLE pepsi.queue ENABLE TRIGGER queue_traceparent_update`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `UPDATE pepsi.queue SET status = 'pending' WHERE ingress_id = $1`, id); err != nil {
		t.Errorf("an update that leaves the traceparent alone ran its check: %v", err)
	}
}

// Schema 25 leaves the check of a traceparent out of the rows the
// dispatcher inserts for emits (a parent_id set: their traceparent is their
// parent's pass's, made from one checked before), and keeps it for every row
// a producer inserts. Counted by EXPLAIN ANALYZE, which lists a trigger with
// the rows it was called for.
func TestSchema25ChecksAProducersTraceparentNotAnEmittedChilds(t *testing.T) {
	t.Parallel()
	conn := pgtest.Connect(t, pgtest.NewMigrated(t))
	const good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	checks := func(parent string) int {
		t.Helper()
		var plan string
		err := conn.QueryRow(t.Context(), `EXPLAIN (ANALYZE, FORMAT JSON) INSERT INTO pepsi.queue (stage, parent_id, traceparent)
			SELECT 'b', `+parent+`, pepsi.pass_traceparent($1, g, 'a', now()) FROM generate_series(1, 10) g`, good).Scan(&plan)
		if err != nil {
			t.Fatal(err)
		}
		var out []struct {
			Triggers []struct {
				Name  string `json:"Trigger Name"`
				Calls int    `json:"Calls"`
			}
		}
		if err := json.Unmarshal([]byte(plan), &out); err != nil || len(out) != 1 {
			t.Fatalf("EXPLAIN's JSON %s: %v", plan, err)
		}
		for _, tr := range out[0].Triggers {
			if tr.Name == "queue_traceparent_insert" {
				return tr.Calls
			}
		}
		return 0
	}
	if n := checks("NULL"); n != 10 {
		t.Errorf("10 rows a producer inserts with a traceparent ran its check %d times; want 10", n)
	}
	if n := checks("1"); n != 0 {
		t.Errorf("10 emitted rows (parent_id set) ran the traceparent's check %d times; want none", n)
	}
}

// Schema 26: no trigger of pepsi.queue calls a function of PEPSI's in its
// WHEN clause, and pepsi.traceparent_ok is inlined where it is called.
// PostgreSQL prepares a WHEN clause for every statement that fires its
// trigger, and a SQL function it cannot inline is parsed and planned again
// in every transaction that calls it: schema 21's update trigger cost every
// step transaction of the dispatcher both, whatever it carried.
func TestSchema26TriggersPrepareNoFunctionOfOurs(t *testing.T) {
	t.Parallel()
	conn := migratedTo(t, 26)
	checkTriggerWhens(t, conn, "queue_traceparent_update")
	var plan string
	if err := conn.QueryRow(t.Context(), `EXPLAIN (VERBOSE, FORMAT JSON) SELECT pepsi.traceparent_ok(traceparent) FROM pepsi.queue`).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(plan, "traceparent_ok") {
		t.Errorf("pepsi.traceparent_ok is called, not inlined:\n%s", plan)
	}
}

// migratedTo is a connection to a new database at schema version v: a test
// of what an earlier version did, which a later one changed.
func migratedTo(t *testing.T, v int) *pgx.Conn {
	t.Helper()
	conn := pgtest.Connect(t, pgtest.NewDatabase(t))
	if _, err := store.MigrateTo(t.Context(), conn, v); err != nil {
		t.Fatalf("migrate to %d: %v", v, err)
	}
	return conn
}

// checkTriggerWhens fails t if a trigger of pepsi.queue calls a function of
// schema pepsi in its WHEN clause, or if trigger want has no WHEN clause
// (which shows the triggers' definitions were read).
func checkTriggerWhens(t *testing.T, conn *pgx.Conn, want string) {
	t.Helper()
	// pg_get_triggerdef qualifies a function by its schema only where the
	// search path would not find it.
	if _, err := conn.Exec(t.Context(), "SET search_path = pg_catalog"); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(t.Context(), `SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger
		WHERE tgrelid = 'pepsi.queue'::regclass AND NOT tgisinternal AND tgqual IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	defs := map[string]string{}
	for rows.Next() {
		var name, def string
		if err := rows.Scan(&name, &def); err != nil {
			t.Fatal(err)
		}
		defs[name] = def
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if _, ok := defs[want]; !ok {
		t.Fatalf("no WHEN clause on %s among %v", want, defs)
	}
	for name, def := range defs {
		when := def[strings.Index(def, " WHEN ")+1 : strings.Index(def, " EXECUTE FUNCTION ")]
		if strings.Contains(when, "pepsi.") {
			t.Errorf("trigger %s calls a function of schema pepsi in its WHEN clause: %s", name, when)
		}
	}
	// pg_get_triggerdef's search path is this connection's: set it back.
	if _, err := conn.Exec(t.Context(), "RESET search_path"); err != nil {
		t.Fatal(err)
	}
}

// pepsi.traceparent_ok (schema 21), and traceparent.Wellformed in Go, say
// of every string what the regular expression of W3C Trace Context version
// 00 says: checked on valid traceparents and on each of them with one byte
// changed, cut or doubled (seeded; the seed is printed).
func TestTraceparentOkAgreesWithTheRegularExpression(t *testing.T) {
	t.Parallel()
	conn := pgtest.Connect(t, pgtest.NewMigrated(t))
	seed := pgtest.Seed(t, "./store/")
	r := rand.New(rand.NewPCG(seed, 0))
	const hex, other = "0123456789abcdef", "-ABCFgz0\\ é\x00x"
	var cases []string
	for range 400 {
		b := []byte("00-")
		for i := range 52 {
			if i == 32 || i == 48 {
				b = append(b, '-')
				continue
			}
			b = append(b, hex[r.IntN(16)])
		}
		cases = append(cases, string(b))
		for range 5 {
			m := []byte(string(b))
			p := r.IntN(len(m))
			switch r.IntN(4) {
			case 0:
				m[p] = other[r.IntN(len(other))]
			case 1:
				m[p] = hex[r.IntN(16)]
			case 2:
				m = append(m[:p], m[p+1:]...)
			default:
				m = append(m[:p], append([]byte{m[p]}, m[p:]...)...)
			}
			if utf8.Valid(m) && !bytes.Contains(m, []byte{0}) {
				cases = append(cases, string(m))
			}
		}
	}
	rows, err := conn.Query(t.Context(), `SELECT tp, pepsi.traceparent_ok(tp), tp ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
		FROM unnest($1::text[]) AS u(tp)
		WHERE pepsi.traceparent_ok(tp) IS DISTINCT FROM (tp ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$')`, cases)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var tp string
		var ok, re bool
		if err := rows.Scan(&tp, &ok, &re); err != nil {
			t.Fatal(err)
		}
		t.Errorf("%q: traceparent_ok %v, the regular expression %v (seed %d)", tp, ok, re, seed)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// Go's rule, where PEPSI reads a traceparent an UPDATE wrote (schema 27),
	// says what the database's says.
	valid := regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)
	for _, tp := range cases {
		if traceparent.Wellformed(tp) != valid.MatchString(tp) {
			t.Errorf("%q: traceparent.Wellformed %v, the regular expression %v (seed %d)", tp, traceparent.Wellformed(tp), valid.MatchString(tp), seed)
		}
	}
}

// Schema 26: a traceparent's check says the same whatever the client's
// encoding. Schema 21's rule read the value's bytes with textsend, which
// converts them to the client's encoding: with a LATIN1 client, 55 bytes of
// "00-" and 26 two-byte letters were 29 bytes there, and the check failed
// with "index out of range" (SQLSTATE 2202E) instead of refusing the value.
func TestATraceparentsCheckIsTheSameInEveryClientEncoding(t *testing.T) {
	t.Parallel()
	conn := pgtest.Connect(t, pgtest.NewMigrated(t))
	ctx := t.Context()
	if _, err := conn.Exec(ctx, "SET client_encoding = 'LATIN1'"); err != nil {
		t.Fatal(err)
	}
	var ok *bool
	if err := conn.QueryRow(ctx, "SELECT pepsi.traceparent_ok('00-' || repeat(chr(233), 26))").Scan(&ok); err != nil {
		t.Fatalf("traceparent_ok of 26 two-byte letters under a LATIN1 client: %v; want false", err)
	}
	if ok == nil || *ok {
		t.Errorf("traceparent_ok of 26 two-byte letters under a LATIN1 client: %v; want false", ok)
	}
	_, err := conn.Exec(ctx, "INSERT INTO pepsi.queue (stage, traceparent) VALUES ('a', '00-' || repeat(chr(233), 26))")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != "queue_traceparent_check" {
		t.Errorf("insert of 26 two-byte letters as a traceparent under a LATIN1 client: %v; want check_violation of queue_traceparent_check", err)
	}
}

// Proves: no migration takes away a function an earlier schema made, nor
// changes what it takes or returns. A dispatcher or stage built for an older
// schema keeps working on a newer one until it is restarted
// (docs/operations.md, "Upgrading"), and they call these functions by name and
// signature (schema 22 once dropped one an older dispatcher's claim called).
func TestMigrationsKeepEveryEarlierFunction(t *testing.T) {
	t.Parallel()
	conn := pgtest.Connect(t, pgtest.NewDatabase(t))
	ctx := context.Background()
	const functionsSQL = `SELECT p.oid::regprocedure::text || ' returns ' || pg_get_function_result(p.oid)
		FROM pg_proc p WHERE p.pronamespace = 'pepsi'::regnamespace ORDER BY 1`
	have := map[string]int{}
	for v := 1; v <= store.Latest(); v++ {
		if _, err := store.MigrateTo(ctx, conn, v); err != nil {
			t.Fatalf("migrate to %d: %v", v, err)
		}
		rows, err := conn.Query(ctx, functionsSQL)
		if err != nil {
			t.Fatal(err)
		}
		now, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		kept := map[string]bool{}
		for _, f := range now {
			kept[f] = true
			if _, ok := have[f]; !ok {
				have[f] = v
			}
		}
		for f, since := range have {
			if !kept[f] {
				t.Errorf("schema %d has no %s, which schema %d made", v, f, since)
			}
		}
	}
}
