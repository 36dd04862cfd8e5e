package main

import (
	"context"
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// TestEnqueueGivesOrderKeys: -order-key gives every message a key, an NDJSON
// line's order_key its own (winning over -order-key), and of one key's
// messages the younger ones wait blocked; a bad key is a usage error that
// inserts nothing.
func TestEnqueueGivesOrderKeys(t *testing.T) {
	t.Parallel()
	url, env := migratedEnv(t)
	pq(t, "a\nb\n", env, "enqueue", "-stage", "parse", "-order-key", "acct-9").
		expect(t, "lines with -order-key", 0, "enqueued 2 messages at stage parse", "")
	ndjson := `{"payload": "c", "order_key": "acct-7"}` + "\n" + `{"payload": "d"}` + "\n"
	pq(t, ndjson, env, "enqueue", "-stage", "parse", "-ndjson").expect(t, "ndjson", 0, "enqueued 2 messages", "")
	pq(t, ndjson, env, "enqueue", "-stage", "parse", "-ndjson", "-order-key", "acct-9").expect(t, "ndjson with -order-key", 0, "enqueued 2 messages", "")
	got := scalar(t, url, `SELECT string_agg(convert_from(payload, 'UTF8') || ' ' || status || ' ' || coalesce(order_key, '-'), ', ' ORDER BY ingress_id) FROM pepsi.queue`)
	want := "a pending acct-9, b blocked acct-9, c pending acct-7, d pending -, c blocked acct-7, d blocked acct-9"
	if got != want {
		t.Errorf("rows %q; want %q", got, want)
	}
	pq(t, "", env, "enqueue", "-stage", "parse", "-n", "1", "-order-key", strings.Repeat("k", 201)).
		expect(t, "long -order-key", 2, "", "-order-key: order_key is 201 bytes long, at most 200")
	pq(t, `{"payload": "x", "order_key": ""}`+"\n", env, "enqueue", "-stage", "parse", "-ndjson").
		expect(t, "empty order_key", 1, "", "input line 1: order_key is empty")
	if n := scalar(t, url, "SELECT count(*)::text FROM pepsi.queue"); n != "6" {
		t.Errorf("%s rows after the refused enqueues; want 6", n)
	}
}

// TestTheOperatorSeesWhatAKeyWaitsBehind: show says a blocked message's
// order key and the head it waits behind (a paused one, with its time),
// stats counts the key behind a paused head, and list -order-key lists the
// key's messages, with their order_key in -json.
func TestTheOperatorSeesWhatAKeyWaitsBehind(t *testing.T) {
	t.Parallel()
	url, env := migratedEnv(t)
	pq(t, "a\nb\nc\n", env, "enqueue", "-stage", "parse", "-order-key", "acct-9").expect(t, "enqueue", 0, "enqueued 3 messages", "")
	pq(t, "d\n", env, "enqueue", "-stage", "parse").expect(t, "enqueue without a key", 0, "enqueued 1 message", "")
	ids := strings.Fields(scalar(t, url, `SELECT string_agg(ingress_id::text, ' ' ORDER BY ingress_id) FROM pepsi.queue WHERE order_key = 'acct-9'`))
	// The head's stage paused it for an hour (and a margin) at deliver.
	scalar(t, url, `UPDATE pepsi.queue SET stage = 'deliver', status = 'paused', timeout = now() + interval '1 hour 30 seconds'
		WHERE ingress_id = `+ids[0]+` RETURNING 'ok'`)
	pq(t, "", env, "show", ids[1]).expect(t, "show of a blocked message", 0,
		"status     blocked\nattempts   0\norder key  acct-9\nwaits      behind message "+ids[0]+" of its order key (paused at deliver until ", "")
	pq(t, "", env, "show", ids[1]).expect(t, "show of a blocked message", 0, ", in 1h0m", "")
	pq(t, "", env, "show", ids[0]).expect(t, "show of the head", 0, "order key  acct-9\npayload", "")
	pq(t, "", env, "stats").expect(t, "stats", 0,
		"ORDER KEYS: 2 messages waiting behind the head of 1 key; keys by what their head does: 1 paused, 0 waiting for its retry, 0 running, 0 pending\n", "")
	// A second key, whose head a worker holds, with one message behind it:
	// the heads are counted in keys (1 paused, 1 running), not in the
	// messages behind them (2 and 1), and the line says so.
	pq(t, "e\nf\n", env, "enqueue", "-stage", "parse", "-order-key", "acct-7").expect(t, "enqueue acct-7", 0, "enqueued 2 messages", "")
	scalar(t, url, `UPDATE pepsi.queue SET status = 'running' WHERE order_key = 'acct-7' AND status = 'pending' RETURNING 'ok'`)
	pq(t, "", env, "stats").expect(t, "stats of two keys", 0,
		"ORDER KEYS: 3 messages waiting behind the head of 2 keys; keys by what their head does: 1 paused, 0 waiting for its retry, 1 running, 0 pending\n", "")
	scalar(t, url, `UPDATE pepsi.queue SET status = 'failed' WHERE order_key = 'acct-7' RETURNING 'ok'`)
	r := pq(t, "", env, "list", "-order-key", "acct-9", "-json")
	r.expect(t, "list -order-key -json", 0, `"order_key":"acct-9"`, "")
	if n := strings.Count(r.stdout, `"order_key":"acct-9"`); n != 3 {
		t.Errorf("list -order-key acct-9 -json listed %d messages of the key:\n%s\nwant 3", n, r.stdout)
	}
	pq(t, "", env, "list", "-order-key", "acct-9", "-count").expect(t, "list -order-key -count", 0, "3\n", "")
	pq(t, "", env, "discard", "-order-key", "acct-9", "-status", "blocked", "-n").expect(t, "discard -order-key -n", 0, "would discard 2 messages", "")
	// The head finished and no release followed (its dispatcher died first):
	// the younger blocked one waits behind the older, which gets the key next.
	scalar(t, url, `UPDATE pepsi.queue SET status = 'done', timeout = NULL WHERE ingress_id = `+ids[0]+` RETURNING 'ok'`)
	pq(t, "", env, "show", ids[2]).expect(t, "show behind an older blocked message", 0,
		"waits      behind message "+ids[1]+" of its order key (blocked at parse)", "")
	pq(t, "", env, "show", ids[1]).expect(t, "show of the key's oldest unfinished message", 0,
		"waits      behind no unfinished message of its order key: pepsi-dispatch hands it the key next", "")
}

// TestRetryOfAKeysOldestSaysWhatItWaitsBehind: a failed message retried while
// a younger message of its key is running (a worker holds it) is the key's
// oldest unfinished message, and waits blocked until that pass ends. The
// retry's output must not say it waits behind an older message: none is.
func TestRetryOfAKeysOldestSaysWhatItWaitsBehind(t *testing.T) {
	t.Parallel()
	url, env := migratedEnv(t)
	pq(t, "a\nb\n", env, "enqueue", "-stage", "parse", "-order-key", "acct-9").expect(t, "enqueue", 0, "enqueued 2 messages", "")
	ids := strings.Fields(scalar(t, url, `SELECT string_agg(ingress_id::text, ' ' ORDER BY ingress_id) FROM pepsi.queue WHERE order_key = 'acct-9'`))
	// The older one failed, and the younger one got the key and runs.
	scalar(t, url, `UPDATE pepsi.queue SET status = 'failed' WHERE ingress_id = `+ids[0]+` RETURNING 'ok'`)
	scalar(t, url, `UPDATE pepsi.queue SET status = 'running' WHERE ingress_id = `+ids[1]+` RETURNING 'ok'`)
	r := pq(t, "", env, "retry", "-id", ids[0])
	r.expect(t, "retry of the key's oldest", 0, "retried 1 message: 0 pending again, 1 blocked behind another message of their order key", "")
	if strings.Contains(r.stdout, "older") && !strings.Contains(r.stdout, "an older unfinished one, or a younger one") {
		t.Errorf("retry says the key's oldest message waits behind an older one: %q", r.stdout)
	}
	if st := scalar(t, url, `SELECT status FROM pepsi.queue WHERE ingress_id = `+ids[0]); st != "blocked" {
		t.Errorf("the retried message is %s; want blocked behind the running one", st)
	}
}

// defaultRepeatableRead makes url's database start every session at
// REPEATABLE READ, as a DBA's ALTER DATABASE would.
func defaultRepeatableRead(t *testing.T, url string) {
	t.Helper()
	if _, err := pgtest.Connect(t, url).Exec(context.Background(), `DO $$ BEGIN
		EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = ''repeatable read''', current_database()); END $$`); err != nil {
		t.Fatal(err)
	}
}

// TestEnqueueOfKeyedMessagesIgnoresARepeatableReadDefault: on a database
// whose sessions start at REPEATABLE READ, enqueue inserts keyed messages
// at READ COMMITTED all the same, which the order-key trigger needs
// (schema 36): at REPEATABLE READ its snapshot could show a head finished
// since as unfinished, and leave the key stuck behind it, so the trigger
// refuses such an insert; enqueue must not be refused.
func TestEnqueueOfKeyedMessagesIgnoresARepeatableReadDefault(t *testing.T) {
	t.Parallel()
	url, env := migratedEnv(t)
	defaultRepeatableRead(t, url)
	pq(t, "a\nb\n", env, "enqueue", "-stage", "parse", "-order-key", "acct-9").
		expect(t, "keyed enqueue", 0, "enqueued 2 messages at stage parse", "")
	got := scalar(t, url, `SELECT string_agg(status, ' ' ORDER BY ingress_id) FROM pepsi.queue`)
	if got != "pending blocked" {
		t.Errorf("statuses %q; want pending blocked", got)
	}
}
