package httpd_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/httpd"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/store"
)

// bigQueue is a queue as it looks after weeks of work: most rows done, a
// backlog pending at one stage, some failed. No read may walk all of it.
const bigQueue = `
INSERT INTO pepsi.queue (stage, status, payload, updated_at)
SELECT CASE WHEN g % 2 = 0 THEN 'parse' ELSE 'deliver' END,
	CASE WHEN g % 100 = 0 THEN 'pending' WHEN g % 997 = 0 THEN 'failed' WHEN g % 1999 = 0 THEN 'paused' ELSE 'done' END,
	'payload', now() - make_interval(secs => g)
FROM generate_series(1, 300000) g;
UPDATE pepsi.queue SET timeout = now() WHERE status = 'paused';
ANALYZE pepsi.queue;
`

func TestEveryReadQueryWalksAnIndexNotTheQueue(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
	if _, err := conn.Exec(ctx, bigQueue); err != nil {
		t.Fatalf("fill the queue: %v", err)
	}
	names := make([]string, 0, len(store.MonitorQueries))
	for name := range store.MonitorQueries {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		var plan []byte
		if err := conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+store.MonitorQueries[name]).Scan(&plan); err != nil {
			t.Fatalf("EXPLAIN %s: %v", name, err)
		}
		var top []struct{ Plan node }
		if err := json.Unmarshal(plan, &top); err != nil || len(top) != 1 {
			t.Fatalf("EXPLAIN %s: %v: %s", name, err, plan)
		}
		for _, n := range top[0].Plan.walk() {
			if n.NodeType == "Seq Scan" && n.RelationName == "queue" {
				t.Errorf("query %s scans the whole queue:\n%s", name, plan)
			}
		}
	}
}

// node is a node of EXPLAIN (FORMAT JSON)'s plan tree.
type node struct {
	NodeType     string `json:"Node Type"`
	RelationName string `json:"Relation Name"`
	Plans        []node `json:"Plans"`
}

func (n node) walk() []node {
	out := []node{n}
	for _, c := range n.Plans {
		out = append(out, c.walk()...)
	}
	return out
}

func TestReadsRunReadOnlyUnderTheStatementTimeout(t *testing.T) {
	t.Parallel()
	src := open(t, httpd.Options{Database: pgtest.NewMigrated(t), StatementTimeout: 1500 * time.Millisecond})
	for setting, want := range map[string]string{
		"statement_timeout":             "1500ms",
		"default_transaction_read_only": "on",
		"application_name":              "pepsi-httpd",
	} {
		var got string
		if err := src.Pool().QueryRow(ctx, "SHOW "+setting).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s = %q, want %q", setting, got, want)
		}
	}
	_, err := src.Pool().Exec(ctx, "SELECT pg_sleep(3)")
	if err == nil || !strings.Contains(err.Error(), "statement timeout") {
		t.Errorf("a 3 s statement: %v, want it cancelled by the statement timeout", err)
	}
}
