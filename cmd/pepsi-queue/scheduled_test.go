package main

import (
	"testing"
)

// TestEnqueueSchedulesMessages: -not-before schedules every message (a
// duration from now, or an RFC 3339 time), an NDJSON line's not_before its
// own (winning over the flag); a scheduled message is paused until its time,
// one whose time has passed is pending; bad times are refused and insert
// nothing.
func TestEnqueueSchedulesMessages(t *testing.T) {
	t.Parallel()
	url, env := migratedEnv(t)
	pq(t, "a\n", env, "enqueue", "-stage", "parse", "-not-before", "1h").
		expect(t, "-not-before 1h", 0, "enqueued 1 message at stage parse", "")
	pq(t, "b\n", env, "enqueue", "-stage", "parse", "-not-before", "2100-01-02T03:04:05Z").
		expect(t, "-not-before a time", 0, "1 message of them scheduled: paused until their not_before\n", "")
	ndjson := `{"payload": "c", "not_before": "2001-01-01T00:00:00Z"}` + "\n" + `{"payload": "d"}` + "\n" +
		`{"payload": "e", "not_before": "2099-05-06T07:08:09.5+02:00"}` + "\n"
	pq(t, ndjson, env, "enqueue", "-stage", "parse", "-ndjson", "-not-before", "2h").
		expect(t, "ndjson with -not-before", 0, "enqueued 3 messages", "")
	got := scalar(t, url, `SELECT string_agg(convert_from(payload, 'UTF8') || ' ' || status || ' ' ||
		CASE WHEN timeout IS NULL THEN '-'
		     WHEN timeout > now() + interval '59 minutes' AND timeout < now() + interval '61 minutes' THEN 'in 1h'
		     WHEN timeout > now() + interval '119 minutes' AND timeout < now() + interval '121 minutes' THEN 'in 2h'
		     ELSE to_char(timeout AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS') END, ', ' ORDER BY ingress_id) FROM pepsi.queue`)
	want := "a paused in 1h, b paused 2100-01-02T03:04:05.000, c pending -, d paused in 2h, e paused 2099-05-06T05:08:09.500"
	if got != want {
		t.Errorf("rows %q; want %q", got, want)
	}
	pq(t, "", env, "enqueue", "-stage", "parse", "-n", "1", "-not-before", "tomorrow").
		expect(t, "a bad -not-before", 2, "", "-not-before: not_before \"tomorrow\" is not an RFC 3339 time")
	pq(t, "", env, "enqueue", "-stage", "parse", "-n", "1", "-not-before", "-5m").
		expect(t, "a negative -not-before", 2, "", "a duration must not be negative")
	pq(t, `{"payload": "x", "not_before": "2026-13-01T00:00:00Z"}`+"\n", env, "enqueue", "-stage", "parse", "-ndjson").
		expect(t, "a bad not_before", 1, "", "input line 1: not_before \"2026-13-01T00:00:00Z\" is not an RFC 3339 time")
	if n := scalar(t, url, "SELECT count(*)::text FROM pepsi.queue"); n != "5" {
		t.Errorf("%s rows after the refused enqueues; want 5", n)
	}
}
