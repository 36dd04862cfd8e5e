package store_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/netfault"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/store"
)

// viaProxy returns a config for url that connects through a new netfault
// proxy, which the test can black-hole: a silent partition.
func viaProxy(t *testing.T, url string) (*pgx.ConnConfig, *netfault.Proxy) {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	p, err := netfault.Start(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	cfg.Host, cfg.Port, cfg.Fallbacks = "127.0.0.1", uint16(p.Port()), nil
	return cfg, p
}

// TestListenNoticesASilentPartition: with no error from the network, the idle
// check finds the connection dead, the listener reports Down, and Up once the
// network heals. Idle checks of a healthy connection report nothing.
func TestListenNoticesASilentPartition(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	holdGate(t, url) // a dispatcher waits: inserts notify
	cfg, p := viaProxy(t, url)
	notices := make(chan store.Notice, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- store.ListenTimed(ctx, cfg, nil, func(n store.Notice) { notices <- n }, 50*time.Millisecond, 300*time.Millisecond)
	}()
	t.Cleanup(func() { cancel(); <-done })
	r := &listenerRun{notices: notices}
	r.expect(t, store.Listening, "start")

	// Let several idle checks pass on a healthy connection; none may report.
	time.Sleep(400 * time.Millisecond)
	writer := pgtest.Connect(t, url)
	if _, err := writer.Exec(t.Context(), "INSERT INTO pepsi.queue (stage) VALUES ('a')"); err != nil {
		t.Fatal(err)
	}
	r.expect(t, store.Notified, "after idle checks on a healthy connection, then an insert")

	p.BlackHole()
	r.expect(t, store.Down, "after the network went silent")
	p.Heal()
	r.expect(t, store.Up, "after the network healed")
	if _, err := writer.Exec(t.Context(), "INSERT INTO pepsi.queue (stage) VALUES ('a')"); err != nil {
		t.Fatal(err)
	}
	r.expect(t, store.Notified, "after an insert once healed")
}

// TestLockIsLostOnASilentPartition: a dispatcher cut off from its database
// cannot count on its lock; the idle check notices and closes Lost.
func TestLockIsLostOnASilentPartition(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	cfg, p := viaProxy(t, url)
	l, err := store.TryLockTimed(t.Context(), cfg, 50*time.Millisecond, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	time.Sleep(400 * time.Millisecond) // several idle checks of a healthy connection
	select {
	case <-l.Lost():
		t.Fatalf("Lost closed on a healthy connection: %v", l.Err())
	default:
	}
	p.BlackHole()
	select {
	case <-l.Lost():
	case <-time.After(waitFor):
		t.Fatalf("Lost not closed within %v of the network going silent", waitFor)
	}
}
