package httpd_test

import (
	"net/http/httptest"
	"testing"

	"github.com/pepsi-pipeline/pepsi/httpd"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// keyedRun holds messages waiting behind their order key: key a behind a
// head its stage paused, b behind one waiting for its retry, c behind a
// running one, and d behind none (its head finished, no release yet). The
// insert trigger blocks every row of a key behind the key's first.
const keyedRun = `
INSERT INTO pepsi.queue (stage, status, timeout, attempts, order_key) VALUES
	('deliver', 'paused', now() + interval '1 hour', 0, 'a'),
	('deliver', 'paused', now() + interval '1 hour', 1, 'b'),
	('parse', 'running', NULL, 0, 'c'),
	('parse', 'done', NULL, 0, 'd');
INSERT INTO pepsi.queue (stage, status, order_key) VALUES
	('deliver', 'pending', 'a'), ('deliver', 'pending', 'a'), ('deliver', 'pending', 'b'),
	('parse', 'pending', 'c'), ('parse', 'blocked', 'd'), ('parse', 'pending', NULL);
`

// TestMessagesWaitingBehindTheirKeyAreExported: the blocked messages count
// per stage, and the keys they wait on by what each key's head is doing.
func TestMessagesWaitingBehindTheirKeyAreExported(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	if _, err := pgtest.Connect(t, url).Exec(ctx, keyedRun); err != nil {
		t.Fatalf("insert the keyed run: %v", err)
	}
	srv := httptest.NewServer(httpd.Handler(open(t, httpd.Options{Database: url})))
	defer srv.Close()
	got := values(scrape(t, srv.URL))
	for key, want := range map[string]float64{
		`pepsi_queue_messages{stage=deliver,status=blocked}`: 3,
		`pepsi_queue_messages{stage=parse,status=blocked}`:   2,
		`pepsi_queue_messages{stage=parse,status=pending}`:   1,
		`pepsi_queue_order_keys_waiting{head=paused}`:        1,
		`pepsi_queue_order_keys_waiting{head=retrying}`:      1,
		`pepsi_queue_order_keys_waiting{head=running}`:       1,
		`pepsi_queue_order_keys_waiting{head=none}`:          1,
		`pepsi_queue_order_keys_waiting{head=pending}`:       0,
	} {
		if g, ok := got[key]; !ok || g != want {
			t.Errorf("%s = %v (present %v), want %v", key, g, ok, want)
		}
	}
}
