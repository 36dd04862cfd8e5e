package dispatch_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/shell/dispatch"
)

// closedPort returns a port of 127.0.0.1 on which nothing listens.
func closedPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

// Feature: a dispatcher that cannot reach its database at start-up keeps saying
// so, and for what, instead of one warning and then silence: on a port where
// nothing listens, on a server without the database, and on one that refuses
// its role (said as such: the server answered, the network is fine).
//
// Not parallel: it shortens the package's reminder intervals.
func TestAnUnreachableDatabaseIsReportedWhileTheDispatcherWaits(t *testing.T) {
	defer dispatch.SetWaitReports(200*time.Millisecond, 400*time.Millisecond)()
	missing, err := url.Parse(pgtest.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	noRole := *missing
	missing.Path = "/pepsi_no_such_database"
	noRole.User = url.User("pepsi_no_such_role")
	for _, c := range []struct{ target, first string }{
		{fmt.Sprintf("postgres://pepsi@127.0.0.1:%d/nowhere?connect_timeout=2", closedPort(t)), "cannot reach the database"},
		{missing.String(), "cannot reach the database"},
		{noRole.String(), "the database refused this dispatcher's login"},
	} {
		reportsWaitingFor(t, c.target, c.first)
	}
}

// reportsWaitingFor runs the dispatcher against database until it has reminded
// three times that it waits, stops it, and checks what the first warning
// (which begins with first) and the reminders said.
func reportsWaitingFor(t *testing.T, database, first string) {
	t.Helper()
	cfg, err := conf.Parse("pepsi.conf", "[stage-a]\nPROGRAM = /bin/cat\n")
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(database)
	if err != nil {
		t.Fatal(err)
	}
	server, dbName := u.Host, u.Path[1:]
	logs := &logBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		code, err := dispatch.Run(ctx, dispatch.Options{
			Config: cfg, Database: database, Log: slog.New(slog.NewJSONHandler(logs, nil)), Signals: make(chan os.Signal),
		})
		if code != dispatch.ExitOK || err != nil {
			err = fmt.Errorf("%s: exit %d, err %v; want exit 0 and no error when stopped while waiting", server, code, err)
		}
		done <- err
	}()
	waitFor(t, 10*time.Second, "three reminders that the dispatcher still waits for "+server, func() (bool, string) {
		return len(logs.lines("still waiting for the database")) >= 3, logs.String()
	})
	cancel()
	if err := <-done; err != nil {
		t.Error(err)
	}

	warned := logs.lines(first)
	if len(warned) != 1 || warned[0]["server"] != server || warned[0]["database"] != dbName {
		t.Errorf("first warnings %q: %v; want one, naming server %s and database %s (log: %s)", first, warned, server, dbName, logs.String())
	}
	since := start.Add(-time.Second).Format(time.RFC3339)
	var last time.Time
	for i, l := range logs.lines("still waiting for the database") {
		if l["server"] != server || l["database"] != dbName || l["err"] == nil || l["waited"] == nil {
			t.Errorf("reminder %d = %v; want server %s, database %s, the error and how long it has waited", i, l, server, dbName)
		}
		if s, _ := l["since"].(string); s < since || s > time.Now().Format(time.RFC3339) {
			t.Errorf("reminder %d says it waits since %v; want the time of the first failure (after %s)", i, l["since"], since)
		}
		// The intervals grow from 200 ms and stop at 400 ms: no burst, no silence.
		if gap := l.time().Sub(last); i > 0 && (gap < 190*time.Millisecond || gap > 2*time.Second) {
			t.Errorf("reminder %d came %v after the one before; want 200 to 400 ms (plus a retry's pause)", i, gap)
		}
		last = l.time()
	}
}
