package queueadmin_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/queueadmin"
)

// A purge that fails says "purge:" once, and, when batches before the
// failing one had committed, how many messages they deleted: it said
// "purge: after 0 rows: purge: ERROR: permission denied for table queue"
// of a purge that had deleted nothing.
func TestAFailedPurgeSaysPurgeOnceAndWhatItDeleted(t *testing.T) {
	t.Parallel()
	conn := pgtest.Connect(t, pgtest.NewMigrated(t))
	// Five old done messages, and a trigger that stands in for whatever
	// refuses a delete: of every message first, then of those after the
	// first batch of two.
	if _, err := conn.Exec(ctx, `INSERT INTO pepsi.queue (stage, status, payload) SELECT 'a', 'done', 'x' FROM generate_series(1, 5);
		UPDATE pepsi.queue SET updated_at = now() - interval '2 days';
		CREATE TABLE refused_after (id bigint); INSERT INTO refused_after VALUES (0);
		CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF OLD.ingress_id > (SELECT id FROM refused_after) THEN RAISE EXCEPTION 'refused'; END IF; RETURN OLD; END $$;
		CREATE TRIGGER refuse BEFORE DELETE ON pepsi.queue FOR EACH ROW EXECUTE FUNCTION refuse()`); err != nil {
		t.Fatal(err)
	}
	n, err := queueadmin.Purge(ctx, conn, 24*time.Hour, 2, nil, nil)
	if err == nil || n != 0 || strings.Count(err.Error(), "purge") != 1 || strings.Contains(err.Error(), "after 0") {
		t.Errorf("a purge refused at its first batch: %d, %v; want 0 and an error that says purge once and nothing of rows after", n, err)
	}
	if _, err := conn.Exec(ctx, `UPDATE refused_after SET id = 2`); err != nil {
		t.Fatal(err)
	}
	n, err = queueadmin.Purge(ctx, conn, 24*time.Hour, 2, nil, nil)
	if err == nil || n != 2 || !strings.Contains(err.Error(), "purge stopped after 2 messages deleted (they stay deleted): purge: ") || !strings.Contains(err.Error(), "refused") {
		t.Errorf("a purge refused at its second batch: %d, %v; want 2 and an error saying the 2 stay deleted", n, err)
	}
}
