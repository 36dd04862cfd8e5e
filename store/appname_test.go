package store_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/store"
)

// The dispatcher finds its own sessions, and an earlier dispatcher's, by their
// application_name in pg_stat_activity, which keeps at most 63 bytes. A host
// name of a cloud machine or a pod can make "pepsi-dispatch HOST PID" longer:
// AppName cuts the host, so the name PostgreSQL shows is the name given.
func TestAppNameIsKeptWholeByPostgreSQL(t *testing.T) {
	t.Parallel()
	host := "ip-10-0-123-45.eu-central-1.compute.internal.example.cluster.local"
	name := store.AppNameFor(host, 4194304)
	if len(name) > store.AppNameMax || !strings.HasPrefix(name, "pepsi-dispatch ip-10-0-123-45.") || !strings.HasSuffix(name, " 4194304") {
		t.Fatalf("AppName for a %d-byte host: %q (%d bytes); want the prefix, the pid, and at most %d bytes", len(host), name, len(name), store.AppNameMax)
	}
	if err := store.CheckAppName(name); err != nil {
		t.Fatalf("CheckAppName(%q): %v; want it accepted", name, err)
	}
	cfg, err := pgx.ParseConfig(pgtest.NewMigrated(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = name
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var shown string
	if err := conn.QueryRow(context.Background(), `SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()`).Scan(&shown); err != nil {
		t.Fatal(err)
	}
	if shown != name {
		t.Errorf("pg_stat_activity shows application_name %q; want %q as given", shown, name)
	}
}

// An application_name PostgreSQL would not keep as given is refused, with a
// reason, rather than left to make the dispatcher miss its own sessions.
func TestCheckAppNameRefusesWhatPostgreSQLRewrites(t *testing.T) {
	t.Parallel()
	for _, name := range []string{strings.Repeat("x", store.AppNameMax+1), "pepsi-dispatch hôte 1", "tab\there"} {
		err := store.CheckAppName(name)
		if err == nil || !strings.Contains(err.Error(), "finds its sessions by it") {
			t.Errorf("CheckAppName(%q): %v; want a refusal that says why", name, err)
		}
	}
	if err := store.CheckAppName(strings.Repeat("x", store.AppNameMax)); err != nil {
		t.Errorf("CheckAppName of %d bytes: %v; want it accepted", store.AppNameMax, err)
	}
}
