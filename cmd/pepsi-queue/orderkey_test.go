package main

import (
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
	url := pgtest.NewMigrated(t)
	env := []string{"PEPSI_DATABASE=" + url}
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
