package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// failedFixture enqueues six messages at parse and leaves them: 1 and 2
// failed ("smtp: connection refused", "exit 3"), 3 timed out at deliver, 4
// paused at deliver retrying "mailbox full" and unchanged for two days, 5
// running at deliver (a worker holds it), 6 pending at parse.
func failedFixture(t *testing.T) (url string, env []string) {
	t.Helper()
	url = pgtest.NewMigrated(t)
	env = []string{"PEPSI_DATABASE=" + url}
	pq(t, "", env, "enqueue", "-stage", "parse", "-n", "6").expect(t, "enqueue", 0, "ids 1-6", "")
	_, err := pgtest.Connect(t, url).Exec(context.Background(), `
		UPDATE pepsi.queue SET status = 'failed', state = '{"dispatch_error": "smtp: Connection refused"}' WHERE ingress_id = 1;
		UPDATE pepsi.queue SET status = 'failed', state = '{"dispatch_error": "exit 3"}' WHERE ingress_id = 2;
		UPDATE pepsi.queue SET status = 'timeout', stage = 'deliver', state = '{"dispatch_error": "no answer within 300s"}' WHERE ingress_id = 3;
		UPDATE pepsi.queue SET status = 'paused', stage = 'deliver', timeout = now() + interval '1 hour', attempts = 2,
			state = '{"dispatch_error": "mailbox full"}', updated_at = now() - interval '2 days' WHERE ingress_id = 4;
		UPDATE pepsi.queue SET status = 'running', stage = 'deliver' WHERE ingress_id = 5`)
	if err != nil {
		t.Fatal(err)
	}
	return url, env
}

// listedIDs runs list -json with args and returns the ids it printed, each
// line checked to carry the fields scripts rely on.
func listedIDs(t *testing.T, env []string, args ...string) []int64 {
	t.Helper()
	r := pq(t, "", env, append([]string{"list", "-json"}, args...)...)
	if r.code != 0 {
		t.Fatalf("list -json %q: exit %d, stderr %q", args, r.code, r.stderr)
	}
	var ids []int64
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("list -json %q printed %q: %v", args, sc.Text(), err)
		}
		for _, k := range []string{"id", "stage", "status", "dispatch_error", "attempts"} {
			if _, ok := m[k]; !ok {
				t.Errorf("list -json line %q has no %q", sc.Text(), k)
			}
		}
		ids = append(ids, int64(m["id"].(float64)))
	}
	return ids
}

func TestListSelectsByStatusStageReasonAndAge(t *testing.T) {
	t.Parallel()
	_, env := failedFixture(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "[1 2 3 4 5 6]"},
		{[]string{"-status", "failed"}, "[1 2]"},
		{[]string{"-status", "failed,timeout"}, "[1 2 3]"},
		{[]string{"-stage", "deliver"}, "[3 4 5]"},
		{[]string{"-reason", "connection REFUSED"}, "[1]"},
		{[]string{"-older-than", "1d"}, "[4]"},
		{[]string{"-id", "2"}, "[2]"},
		{[]string{"-limit", "2"}, "[1 2]"},
		{[]string{"-status", "done"}, "[]"},
	} {
		if got := formatIDs(listedIDs(t, env, c.args...)); got != c.want {
			t.Errorf("list %q = %s, want %s", c.args, got, c.want)
		}
	}
	pq(t, "", env, "list", "-status", "failed", "-count").expect(t, "list -count", 0, "2\n", "")
	r := pq(t, "", env, "list", "-status", "failed")
	r.expect(t, "list as a table", 0, "id  stage  status  attempts  unchanged for  dispatch_error", "")
	r.expect(t, "list as a table", 0, "smtp: Connection refused", "")
	pq(t, "", env, "list", "-status", "lost").expect(t, "a status that is none", 2, "", `-status: "lost" is not one of pending, running, paused`)
	pq(t, "", env, "list", "-json", "-count").expect(t, "both outputs", 2, "", "-json and -count exclude each other")
	pq(t, "", env, "list", "-older-than", "soon").expect(t, "a bad age", 2, "", `"soon" is not an age`)
	pq(t, "", env, "list", "-older-than", "106751d").expect(t, "an age too long", 2, "", `"106751d" is more than 100 years`)
}

func formatIDs(ids []int64) string {
	return fmt.Sprint(ids)
}

// Proves: discard ends pending and paused messages failed with a reason that
// names the operator's action, never a running (held) or finished one; a dry
// run changes nothing; a bare discard is refused.
func TestDiscardEndsWaitingMessagesAndNeverAHeldOne(t *testing.T) {
	t.Parallel()
	url, env := failedFixture(t)
	pq(t, "", env, "discard").expect(t, "discard without a filter", 2, "", "no filter given")
	pq(t, "", env, "discard", "-status", "running").expect(t, "discard running", 2, "", `-status: "running" is not one of pending, paused`)
	pq(t, "", env, "discard", "-id", "5").expect(t, "discard a held message", 1, "", "message 5 was not discarded")
	pq(t, "", env, "discard", "-id", "1").expect(t, "discard a failed message", 1, "", "message 1 was not discarded")
	pq(t, "", env, "discard", "-id", "5", "-n").expect(t, "dry run of a held message", 1, "", "message 5 would not be discarded")
	pq(t, "", env, "discard", "-id", "4", "-stage", "nosuch").expect(t, "discard -id beside another filter", 1, "", "or does not match the other filters")
	pq(t, "", env, "discard", "-id", "4", "-note", "bad \xff").expect(t, "a note that is not UTF-8", 2, "", `-note "bad \xff" is not valid UTF-8`)
	pq(t, "", env, "discard", "-reason", "\xff").expect(t, "a reason that is not UTF-8", 2, "", "-reason")
	// A -reason meant as the text to write selects nothing, and says why.
	pq(t, "", env, "discard", "-id", "4", "-reason", "stale import").expect(t, "discard -id with a -reason no message has", 1, "",
		"message 4 was not discarded: it does not exist, or is not pending, paused or blocked, or does not match the other filters (see pepsi-queue show 4); -reason selects messages by the dispatch_error they already have; to record your own reason, use -note")
	pq(t, "", env, "discard", "-stage", "deliver", "-reason", "stale import").expect(t, "discard with a -reason no message has", 0,
		"discarded 0 messages", "pepsi-queue discard: nothing selected; -reason selects messages by the dispatch_error they already have; to record your own reason, use -note\n")
	pq(t, "", env, "discard", "-all", "-n").expect(t, "dry run", 0, "would discard 2 messages (nothing changed: -n)", "")
	if got := scalar(t, url, "SELECT string_agg(ingress_id || ':' || status, ' ' ORDER BY ingress_id) FROM pepsi.queue WHERE ingress_id IN (4, 6)"); got != "4:paused 6:pending" {
		t.Errorf("after a dry run: %s, want 4:paused 6:pending", got)
	}
	pq(t, "", env, "discard", "-stage", "deliver", "-reason", "mailbox", "-note", "ticket 881").
		expect(t, "discard by reason", 0, "discarded 1 message: failed now", "")
	pq(t, "", env, "discard", "-all").expect(t, "discard the rest", 0, "discarded 1 message", "")
	got := scalar(t, url, `SELECT string_agg(ingress_id || ':' || status || ':' || coalesce(state->>'dispatch_error', '') || ':' || coalesce(timeout::text, '-'), ' | ' ORDER BY ingress_id)
		FROM pepsi.queue WHERE ingress_id IN (4, 5, 6)`)
	want := "4:failed:discarded by an operator (pepsi-queue discard): ticket 881:- | 5:running::- | 6:failed:discarded by an operator (pepsi-queue discard):-"
	if got != want {
		t.Errorf("after discard:\n got %s\nwant %s", got, want)
	}
	// A discarded message is failed like any other: retry sends it round again.
	pq(t, "", env, "retry", "-id", "6").expect(t, "retry a discarded message", 0, "retried 1 message", "")
}

// Proves: retry selects by the dispatcher's reason, ignoring case, and -n
// counts what it would retry without changing anything.
func TestRetryByReasonWithADryRunFirst(t *testing.T) {
	t.Parallel()
	url, env := failedFixture(t)
	pq(t, "", env, "retry", "-reason", "CONNECTION refused", "-n").expect(t, "dry run", 0, "would retry 1 message (nothing changed: -n)", "")
	if got := scalar(t, url, "SELECT status FROM pepsi.queue WHERE ingress_id = 1"); got != "failed" {
		t.Errorf("after a dry run message 1 is %s, want failed", got)
	}
	pq(t, "", env, "retry", "-reason", "CONNECTION refused").expect(t, "retry by reason", 0, "retried 1 message: pending again", "")
	got := scalar(t, url, "SELECT string_agg(ingress_id || ':' || status, ' ' ORDER BY ingress_id) FROM pepsi.queue WHERE ingress_id <= 3")
	if want := "1:pending 2:failed 3:timeout"; got != want {
		t.Errorf("after retry -reason: %s, want %s", got, want)
	}
}

// Proves: a filter given an empty value ("-stage $S" with S unset), or -id 0,
// is a bad command line that changes nothing, not a filter left out, which
// would widen retry and discard to every message; a -stage or -order-key
// that is not UTF-8 names its flag (exit 2), as does an enqueue's -stage
// that no configuration could have.
func TestAnEmptyFilterIsRefusedNotIgnored(t *testing.T) {
	t.Parallel()
	url, env := failedFixture(t)
	before := scalar(t, url, "SELECT string_agg(ingress_id || ':' || status, ' ' ORDER BY ingress_id) FROM pepsi.queue")
	for _, args := range [][]string{
		{"retry", "-stage", "", "-status", "failed"},
		{"retry", "-reason", "", "-stage", "deliver"},
		{"retry", "-to", "", "-all"},
		{"discard", "-order-key", "", "-status", "paused"},
		{"discard", "-stage", "", "-status", "pending"},
		{"list", "-status", ""},
		{"list", "-older-than", "", "-count"},
		{"purge", "-older-than", "7d", "-status", ""},
		{"enqueue", "-stage", "parse", "-payload", "x", "-not-before", ""},
		{"enqueue", "-stage", "parse", "-payload", "x", "-traceparent", ""},
	} {
		flag := args[len(args)-2]
		if args[len(args)-1] != "" {
			flag = args[1]
		}
		pq(t, "", env, args...).expect(t, strings.Join(args, " "), 2, "", flag+" is given an empty value")
	}
	pq(t, "", env, "list", "-id", "0").expect(t, "list -id 0", 2, "", "-id 0 is not a message id")
	pq(t, "", env, "retry", "-id", "0").expect(t, "retry -id 0", 2, "", "-id 0 is not a message id")
	pq(t, "", env, "list", "-order-key", "a\xff").expect(t, "an order key that is not UTF-8", 2, "", "-order-key")
	pq(t, "", env, "enqueue", "-stage", "a\xff", "-payload", "x").expect(t, "an enqueue's stage that is not UTF-8", 2, "", "-stage")
	for _, stage := range []string{"done", "a b", strings.Repeat("s", 64)} {
		pq(t, "", env, "enqueue", "-stage", stage, "-payload", "x").expect(t, "enqueue at "+stage, 2, "", "is not a stage name")
	}
	if after := scalar(t, url, "SELECT string_agg(ingress_id || ':' || status, ' ' ORDER BY ingress_id) FROM pepsi.queue"); after != before {
		t.Errorf("the refused commands changed the queue:\n before %s\n after  %s", before, after)
	}
}
