package store_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/store"
)

// The message page reads a message's parent, its children (a count, and the
// first store.ChildrenMax ids, oldest first) and its payload size; a message
// without either has parent 0, no children and, without a payload, no size.
func TestThePageMessageNamesItsParentChildrenAndPayloadSize(t *testing.T) {
	t.Parallel()
	_, conn := pgtest.NewMigratedConn(t)
	ctx := t.Context()
	var parent, lone int64
	if err := conn.QueryRow(ctx, `INSERT INTO pepsi.queue (stage, payload) VALUES ('parse', '\x0102030405') RETURNING ingress_id`).Scan(&parent); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `INSERT INTO pepsi.queue (stage) VALUES ('parse') RETURNING ingress_id`).Scan(&lone); err != nil {
		t.Fatal(err)
	}
	children := store.ChildrenMax + 5
	var ids []int64
	rows, err := conn.Query(ctx, `INSERT INTO pepsi.queue (stage, payload, parent_id)
		SELECT 'deliver', convert_to(repeat('x', i), 'UTF8'), $1 FROM generate_series(1, $2) i RETURNING ingress_id`, parent, children)
	if err != nil {
		t.Fatal(err)
	}
	if ids, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	q := store.On(conn)

	m, err := q.ReadPageMessage(ctx, parent)
	if err != nil {
		t.Fatal(err)
	}
	if m.ParentID != 0 || m.Children != int64(children) || !slices.Equal(m.FirstChildren, ids[:store.ChildrenMax]) {
		t.Errorf("the parent: parent %d, %d children, first %v; want 0, %d, %v", m.ParentID, m.Children, m.FirstChildren, children, ids[:store.ChildrenMax])
	}
	if n, err := q.PayloadSize(ctx, parent); err != nil || n == nil || *n != 5 {
		t.Errorf("the parent's payload size: %v, %v; want 5", deref(n), err)
	}
	c, err := q.ReadPageMessage(ctx, ids[2])
	if err != nil {
		t.Fatal(err)
	}
	if c.ParentID != parent || c.Children != 0 || len(c.FirstChildren) != 0 {
		t.Errorf("a child: parent %d, %d children, first %v; want %d, 0, none", c.ParentID, c.Children, c.FirstChildren, parent)
	}
	if n, err := q.PayloadSize(ctx, ids[2]); err != nil || n == nil || *n != 3 {
		t.Errorf("the third child's payload size: %v, %v; want 3", deref(n), err)
	}
	l, err := q.ReadPageMessage(ctx, lone)
	if err != nil {
		t.Fatal(err)
	}
	if l.ParentID != 0 || l.Children != 0 || len(l.FirstChildren) != 0 {
		t.Errorf("a message of its own: parent %d, %d children, first %v; want none", l.ParentID, l.Children, l.FirstChildren)
	}
	for _, id := range []int64{lone, 999999999} {
		if n, err := q.PayloadSize(ctx, id); err != nil || n != nil {
			t.Errorf("message %d's payload size: %v, %v; want none (no payload, or no message)", id, deref(n), err)
		}
	}
}

func deref(n *int64) any {
	if n == nil {
		return nil
	}
	return *n
}

// The page's read of a message finds its children through the queue_parent
// index, with the custom and the generic plan: on a queue of 200,000 rows it
// scans none of them sequentially.
func TestThePageMessageReadsChildrenThroughTheParentIndex(t *testing.T) {
	t.Parallel()
	_, conn := pgtest.NewMigratedConn(t)
	execAll(t, conn,
		"ALTER TABLE pepsi.queue SET (autovacuum_enabled = false)",
		// One message in 1,000 has three children.
		`INSERT INTO pepsi.queue (stage, status, parent_id) SELECT 'parse', 'done', CASE WHEN i > 100 AND i % 1000 < 3 THEN i - i % 1000 END
			FROM generate_series(1, 200000) i`,
		"ANALYZE pepsi.queue",
		"PREPARE page(bigint) AS "+store.PageMessageSQL,
	)
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		plan := explain(t, conn, mode, "page", "1000")
		var parentScans int
		plan.walk(nil, func(n, _ *planNode) {
			if n.RelationName == "queue" && !strings.HasPrefix(n.NodeType, "Index") && n.NodeType != "Bitmap Heap Scan" {
				t.Errorf("%s: the page reads the queue by %s:\n%s", mode, n.NodeType, plan)
			}
			if n.IndexName == "queue_parent" {
				parentScans++
			}
		})
		if parentScans != 2 {
			t.Errorf("%s: %d scans of queue_parent, want 2 (the count and the list):\n%s", mode, parentScans, plan)
		}
	}
}

// Schema 20 lets pepsi_monitor, and no other role, learn a payload's size
// (pepsi.payload_size), and not its bytes. (The role is the server's:
// pgtest.MonitorRole makes it when it is missing, and leaves it.)
func TestSchema20GrantsThePayloadSizeToTheMonitorRoleAlone(t *testing.T) {
	t.Parallel()
	conn := pgtest.Connect(t, pgtest.NewDatabase(t))
	ctx := t.Context()
	pgtest.MonitorRole(t, conn)
	other := fmt.Sprintf("pepsi_other_%d", time.Now().UnixNano()%1e9)
	if _, err := conn.Exec(ctx, "CREATE ROLE "+other+"; GRANT USAGE ON SCHEMA public TO "+other); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Exec(context.Background(), "DROP OWNED BY "+other+"; DROP ROLE "+other) //nolint:errcheck // best effort: roles outlive databases
	})
	if _, err := store.MigrateTo(ctx, conn, 20); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "GRANT USAGE ON SCHEMA pepsi TO "+other); err != nil {
		t.Fatal(err)
	}
	for role, want := range map[string]bool{"pepsi_monitor": true, other: false} {
		var may bool
		if err := conn.QueryRow(ctx, `SELECT has_function_privilege($1, 'pepsi.payload_size(bigint)', 'EXECUTE')`, role).Scan(&may); err != nil || may != want {
			t.Errorf("%s may execute pepsi.payload_size: %v, %v; want %v", role, may, err, want)
		}
		if err := conn.QueryRow(ctx, `SELECT has_column_privilege($1, 'pepsi.queue', 'payload', 'SELECT')`, role).Scan(&may); err != nil || may {
			t.Errorf("%s may read payload: %v, %v; want false", role, may, err)
		}
	}
}
