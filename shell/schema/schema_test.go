package schema_test

import (
	"context"
	"testing"

	"github.com/pepsi-pipeline/pepsi/shell/pgtest"
	"github.com/pepsi-pipeline/pepsi/shell/schema"
)

func TestMigrateIsIdempotent(t *testing.T) {
	t.Parallel()
	conn := pgtest.Connect(t, pgtest.NewDatabase(t))
	ctx := context.Background()
	applied, err := schema.Migrate(ctx, conn)
	if err != nil {
		t.Fatalf("first migrate: %v", err)
	}
	if len(applied) == 0 || applied[len(applied)-1] != schema.Latest() {
		t.Fatalf("first migrate applied %v, want up to version %d", applied, schema.Latest())
	}
	again, err := schema.Migrate(ctx, conn)
	if err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	if len(again) != 0 {
		t.Fatalf("second migrate applied %v, want nothing", again)
	}
	v, err := schema.Version(ctx, conn)
	if err != nil || v != schema.Latest() {
		t.Fatalf("Version = %d, %v; want %d", v, err, schema.Latest())
	}
	for _, idx := range []string{"queue_pending", "queue_paused", "queue_running"} {
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT to_regclass('pepsi.'||$1) IS NOT NULL", idx).Scan(&ok); err != nil || !ok {
			t.Errorf("index pepsi.%s missing (err %v)", idx, err)
		}
	}
}

func TestInsertNotifiesIngressOncePerStatement(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	listener := pgtest.Connect(t, url)
	writer := pgtest.Connect(t, url)
	ctx := context.Background()
	if _, err := listener.Exec(ctx, "LISTEN ingress"); err != nil {
		t.Fatal(err)
	}
	pgtest.HoldGate(t, url) // a dispatcher waits for work: inserts notify
	if _, err := writer.Exec(ctx, "INSERT INTO pepsi.queue (stage) SELECT 'a' FROM generate_series(1, 100)"); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	n, err := listener.WaitForNotification(ctx)
	if err != nil || n.Channel != "ingress" {
		t.Fatalf("WaitForNotification = %v, %v; want one on ingress", n, err)
	}
	// A bulk insert of 100 rows must notify once: a second wait finds nothing.
	short, cancel := context.WithTimeout(ctx, 300e6)
	defer cancel()
	if n, err := listener.WaitForNotification(short); err == nil {
		t.Fatalf("second notification %v: a 100-row insert notified more than once", n)
	}
}
