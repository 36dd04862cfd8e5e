package httpd_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/httpd"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/store"
)

// A stage whose backlog has waited 90 s, and a message retried a moment ago
// whose id is lower (it was made first): the claim takes the retried one
// first, but the backlog has waited 90 s all the same. pepsi-queue stats says
// so, and the metric behind PepsiStageBacklogOld must say the same: it read
// the head of the pending queue, and a retry (or a reset, or a message handed
// its order key) at a low id made a stalled backlog look fresh.
func TestTheOldestPendingAgeIsTheLongestWaitNotTheHeads(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	if _, err := pgtest.Connect(t, url).Exec(ctx, `
INSERT INTO pepsi.queue (stage, status, payload, updated_at, ready_at)
	VALUES ('parse', 'pending', 'x', now(), now());
INSERT INTO pepsi.queue (stage, status, payload, updated_at, ready_at)
	SELECT 'parse', 'pending', 'x', now() - interval '90 seconds', now() - interval '90 seconds' FROM generate_series(1, 3);`); err != nil {
		t.Fatalf("insert: %v", err)
	}
	depths, err := store.On(pgtest.Connect(t, url)).CountRows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var stats time.Duration
	for _, d := range depths {
		if d.Stage == "parse" && d.Status == core.StatusPending {
			stats = d.OldestWait
		}
	}
	src := open(t, httpd.Options{Database: url, Stages: []string{"parse"}})
	srv := httptest.NewServer(httpd.Handler(src, nil))
	defer srv.Close()
	age := values(scrape(t, srv.URL))["pepsi_queue_oldest_pending_age_seconds{stage=parse}"]
	if stats < 90*time.Second || age < 90 || age > stats.Seconds()+60 {
		t.Errorf("oldest pending at parse: pepsi-queue stats %s, pepsi_queue_oldest_pending_age_seconds %.3fs; want both 90 s or more, the same wait", stats, age)
	}
}
