package store_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/store"
)

// pepsi.history's days are UTC days whatever the server's time zone. In
// America/Santiago 2026-09-06 has no midnight (the clocks go from 23:59:59
// to 01:00), and a series of days cast to timestamptz in that zone steps at
// 01:00 from there on: schema 16's pepsi.history_keep then left out the last
// day of each range that crossed it. A transaction that resolves a pass
// answered on 2026-09-06 (UTC) and begins on 2026-09-07 did not make
// 2026-09-07, and its row of that day was refused ("no partition of
// relation"); the days ahead ended a day short.
func TestHistoryDaysAreMadeAcrossAMidnightTheServersZoneSkips(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	owner := pgtest.Connect(t, url)
	var db string
	if err := owner.QueryRow(t.Context(), "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Exec(t.Context(), `ALTER DATABASE "`+db+`" SET timezone = 'America/Santiago'`); err != nil {
		t.Fatal(err)
	}
	// A pool opened after the ALTER: its sessions are in that zone.
	pool := newPool(t, url, &tripCounter{})
	h := &harness{Queue: store.New(pool, testLogger(t)), url: url, pool: pool}
	// The premise, as the server's time zone data has it: that day's midnight
	// does not exist there. Should Chile's rules change (they often have), the
	// test would pass whatever pepsi.history_keep does: it says so instead.
	var hour string
	if err := pool.QueryRow(t.Context(), `SELECT to_char(date '2026-09-06'::timestamptz, 'HH24')`).Scan(&hour); err != nil {
		t.Fatal(err)
	}
	if hour != "01" {
		t.Fatalf("2026-09-06's midnight in America/Santiago is %s:00; want 01:00 (the clocks jump at midnight): the test proves nothing with this server's zone data", hour)
	}
	ids := make([]int64, 1)
	if err := owner.QueryRow(t.Context(), `INSERT INTO pepsi.queue (stage, status, timeout)
		VALUES ('a', 'paused', '2026-09-06 12:00:00+00') RETURNING ingress_id`).Scan(&ids[0]); err != nil {
		t.Fatal(err)
	}
	answered := time.Date(2026, 9, 6, 23, 59, 59, 0, time.UTC)
	now := time.Date(2026, 9, 7, 0, 0, 1, 0, time.UTC)
	evs := h.Exec(t.Context(), []core.Command{
		core.KeepHistory{Op: 1, From: answered, Now: now, Through: now.Add(core.HistoryAhead), DropBefore: answered},
		core.Wake{Op: 2, Now: now},
	})
	for _, ev := range evs {
		if _, err := result(ev); err != "" {
			t.Fatalf("the transaction of %s: %v", now.Format(time.RFC3339), ev)
		}
	}
	if kept := evs[0].(core.HistoryKept); !kept.Through.Equal(time.Date(2026, 9, 11, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("the days made end at %s; want 2026-09-11T00:00:00Z (2026-09-06 to 2026-09-10)", kept.Through.UTC().Format(time.RFC3339))
	}
	days, err := store.On(owner).HistoryPartitions(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range days {
		names = append(names, d.Format("2006-01-02"))
	}
	got := strings.Join(names, " ")
	for _, want := range []string{"2026-09-06", "2026-09-07", "2026-09-08", "2026-09-09", "2026-09-10"} {
		if !strings.Contains(got, want) {
			t.Errorf("partitions %s; want %s among them", got, want)
		}
	}
}
