package httpd_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/httpd"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// tzChild marks the run of this test binary that a test started again under
// another TZ: Go reads the local zone once, at start.
const tzChild = "PEPSI_HTTPD_TEST_TZ_CHILD"

// A message scheduled for the last hours of the year 9999 in UTC (a
// not_before the producers accept: docs/protocol.md, "Scheduled messages")
// falls in the year 10000 in a zone east of UTC, which JSON's times cannot
// hold. Its page is served whatever the zone pepsi-httpd runs in, and a
// blocked message's page shows it as its key's head; it was an empty 200.
func TestAMessageDueAtTheEndOfYear9999IsServedEastOfUTC(t *testing.T) {
	if os.Getenv(tzChild) == "" {
		t.Parallel()
		cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), tzChild+"=1", "TZ=Asia/Kolkata")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("under TZ=Asia/Kolkata: %v\n%s", err, out)
		}
		return
	}
	if _, off := time.Now().Zone(); off != 5*3600+1800 {
		t.Fatalf("the local zone's offset is %ds, want +05:30 (TZ=Asia/Kolkata)", off)
	}
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
	var scheduled, blocked int64
	if err := conn.QueryRow(ctx, `INSERT INTO pepsi.queue (stage, status, timeout, order_key)
		VALUES ('remind', 'paused', '9999-12-31 23:00:00+00', 'k') RETURNING ingress_id`).Scan(&scheduled); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `INSERT INTO pepsi.queue (stage, order_key) VALUES ('remind', 'k') RETURNING ingress_id`).Scan(&blocked); err != nil {
		t.Fatal(err)
	}
	src := open(t, httpd.Options{Database: url})
	srv := httptest.NewServer(httpd.Handler(src, nil))
	defer srv.Close()
	want := time.Date(9999, 12, 31, 23, 0, 0, 0, time.UTC)
	for _, id := range []int64{scheduled, blocked} {
		code, body := get(t, fmt.Sprintf("%s/api/messages/%d", srv.URL, id))
		var m httpd.Message
		if err := json.Unmarshal([]byte(body), &m); err != nil || code != http.StatusOK {
			t.Fatalf("GET /api/messages/%d: %d %v %q", id, code, err, body)
		}
		due := m.Timeout
		if id == blocked {
			if m.WaitsBehind == nil {
				t.Fatalf("GET /api/messages/%d: %s; want it waiting behind %d", id, body, scheduled)
			}
			due = m.WaitsBehind.Timeout
		}
		if due == nil || !due.Equal(want) {
			t.Errorf("GET /api/messages/%d: %s; want due %s", id, body, want.Format(time.RFC3339))
		}
	}
}
