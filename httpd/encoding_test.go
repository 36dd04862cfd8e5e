package httpd_test

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/httpd"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/store"
)

// sqlASCIIDatabase makes a migrated database of encoding SQL_ASCII (what
// initdb makes under LANG=C), which stores any bytes as text, and returns
// its URL; it is dropped when the test ends.
func sqlASCIIDatabase(t *testing.T) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "pepsi_test_ascii_" + hex.EncodeToString(b[:])
	admin := pgtest.Connect(t, pgtest.AdminURL(t))
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name+" ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"); err != nil {
		t.Fatalf("create a SQL_ASCII database: %v", err)
	}
	t.Cleanup(func() { // after the test's own connections are closed
		c, err := pgx.Connect(ctx, pgtest.AdminURL(t))
		if err == nil {
			defer c.Close(ctx)
			_, err = c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		}
		if err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})
	u, err := url.Parse(pgtest.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	conn := pgtest.Connect(t, u.String())
	if _, err := store.Migrate(ctx, conn); err != nil {
		t.Fatalf("migrate %s: %v", name, err)
	}
	return u.String()
}

// TestAStageNameThatIsNotUTF8DoesNotEndTheScrape: in a SQL_ASCII database
// a stage name may hold bytes that are not UTF-8 (a producer's INSERT); a
// scrape then exports its series with U+FFFD for them, as /api/status shows
// it, rather than panicking in the registry's goroutine, which ended
// pepsi-httpd at every scrape.
func TestAStageNameThatIsNotUTF8DoesNotEndTheScrape(t *testing.T) {
	t.Parallel()
	db := sqlASCIIDatabase(t)
	if _, err := pgtest.Connect(t, db).Exec(ctx, `INSERT INTO pepsi.queue (stage, status, state) VALUES (E'bad\xff', 'failed', '{"error": "x"}')`,
		pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	src := open(t, httpd.Options{Database: db})
	srv := httptest.NewServer(httpd.Handler(src, nil))
	defer srv.Close()
	code, body := get(t, srv.URL+"/metrics")
	if want := `pepsi_queue_messages{stage="bad` + "\uFFFD" + `",status="failed"} 1`; code != http.StatusOK || !strings.Contains(body, want) {
		t.Errorf("GET /metrics: %d, lacks %s:\n%s", code, want, body)
	}
	if code, body := get(t, srv.URL+"/api/status"); code != http.StatusOK || !strings.Contains(body, `"stage":"bad\ufffd"`) {
		t.Errorf("GET /api/status: %d %s; want the stage with U+FFFD", code, body)
	}
}
