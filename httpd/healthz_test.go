package httpd_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/httpd"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// TestHealthzAnswersWhileMessagePagesWaitOnALock: message pages read one at
// a time, so however many wait behind a lock on the queue (a migration, a
// VACUUM FULL), /healthz keeps a connection and says the database answers,
// as it does (pepsi-httpd(8): 200 if the database answers within 3 s). With
// every connection taken by waiting pages it once said "database
// unreachable".
func TestHealthzAnswersWhileMessagePagesWaitOnALock(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
	var id int64
	if err := conn.QueryRow(ctx, `INSERT INTO pepsi.queue (stage, payload) VALUES ('a', 'x') RETURNING ingress_id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	src := open(t, httpd.Options{Database: url})
	srv := httptest.NewServer(httpd.Handler(src, nil))
	defer srv.Close()
	tx, err := pgtest.Connect(t, url).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE pepsi.queue IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second}
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp, err := client.Get(srv.URL + "/api/messages/" + strconv.FormatInt(id, 10)); err == nil {
				resp.Body.Close()
			}
		}()
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name = 'pepsi-httpd' AND wait_event_type = 'Lock'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no message page's read waits on the lock after 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // the other pages' requests are in by now
	if code, body := get(t, srv.URL+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while pages wait on a lock: %d %q; want 200 (the database answers)", code, body)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}
