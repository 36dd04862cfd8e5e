package main

import (
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/queueadmin"
)

// A listing cut at -limit says so under the table ("the first N; -limit 0
// lists them all"); one whose selection holds exactly -limit messages, or
// fewer, was not cut and does not say so: "list -id 42 -limit 1" said
// "(the first 1; ...)", as if there were more.
func TestListSaysItWasCutOnlyWhenItWas(t *testing.T) {
	t.Parallel()
	_, conn := pgtest.NewMigratedConn(t)
	if _, err := conn.Exec(t.Context(), `INSERT INTO pepsi.queue (stage, payload) SELECT 'a', 'x' FROM generate_series(1, 3)`); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		sel   queueadmin.Selection
		limit int
		rows  int
		cut   bool
		what  string
	}{
		{queueadmin.Selection{}, 2, 2, true, "3 messages, -limit 2"},
		{queueadmin.Selection{}, 3, 3, false, "3 messages, -limit 3"},
		{queueadmin.Selection{}, 4, 3, false, "3 messages, -limit 4"},
		{queueadmin.Selection{ID: 2}, 1, 1, false, "-id 2 -limit 1"},
		{queueadmin.Selection{}, 0, 3, false, "3 messages, -limit 0"},
	} {
		var b strings.Builder
		if err := printList(t.Context(), conn, &b, tc.sel, tc.limit, false, time.Now()); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		cut := strings.Contains(out, "(the first ")
		rows := strings.Count(out, "\n") - 1
		if cut {
			rows--
		}
		if rows != tc.rows || cut != tc.cut {
			t.Errorf("list of %s: %d rows, said cut: %v; want %d rows, cut: %v\n%s", tc.what, rows, cut, tc.rows, tc.cut, out)
		}
	}
}
