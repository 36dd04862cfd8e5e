package pgqueue_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/shell/pgqueue"
	"github.com/pepsi-pipeline/pepsi/shell/pgtest"
)

func connConfig(t *testing.T, url string) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func tryLock(t *testing.T, cfg *pgx.ConnConfig) *pgqueue.Lock {
	t.Helper()
	l, err := pgqueue.TryLock(t.Context(), cfg, nil)
	if err != nil {
		t.Fatalf("TryLock on a free lock: %v", err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	return l
}

// lockHolderPID is the backend pid pg_locks shows holding the dispatcher lock.
func lockHolderPID(t *testing.T, conn *pgx.Conn) int32 {
	t.Helper()
	var pid int32
	err := conn.QueryRow(t.Context(), `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND classid = 1885696115 AND objid = 1684632432 AND objsubid = 1
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&pid)
	if err != nil {
		t.Fatalf("find the lock in pg_locks (by the key documented on LockKey): %v", err)
	}
	return pid
}

func TestSecondTryLockFailsNamingTheHolder(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	cfg := connConfig(t, url)
	tryLock(t, cfg)
	holder := lockHolderPID(t, pgtest.Connect(t, url))

	second, err := pgqueue.TryLock(t.Context(), cfg, nil)
	var held *pgqueue.HeldError
	if !errors.As(err, &held) {
		if second != nil {
			_ = second.Release(context.Background())
		}
		t.Fatalf("second TryLock = %v, want a *HeldError", err)
	}
	if held.PID != holder || held.ApplicationName != pgqueue.AppName() || held.ClientAddr != "127.0.0.1" ||
		held.BackendStart.IsZero() || time.Since(held.BackendStart) > time.Hour {
		t.Errorf("HeldError = %+v; want pid %d, application_name %q, client 127.0.0.1, a recent backend start",
			*held, holder, pgqueue.AppName())
	}
	msg := err.Error()
	for _, want := range []string{strconv.Itoa(int(holder)), pgqueue.AppName(), "127.0.0.1"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not name the holder's %q", msg, want)
		}
	}
}

func TestStandbyTakesTheLockWhenTheHolderReleasesIt(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	cfg := connConfig(t, url)
	first := tryLock(t, cfg)
	standby := startStandby(t, cfg)
	select {
	case <-standby.done:
		t.Fatalf("standby returned (%v) while the lock was held", standby.err)
	default:
	}
	if err := first.Release(t.Context()); err != nil {
		t.Fatalf("release: %v", err)
	}
	awaitStandby(t, standby)
	select {
	case <-first.Lost():
		t.Fatalf("Release closed Lost (%v); want Lost only when the connection dies", first.Err())
	default:
	}
	if _, err := pgqueue.TryLock(t.Context(), cfg, nil); err == nil {
		t.Fatal("TryLock succeeded while the standby holds the lock")
	}
}

// TestLockLossIsReportedAndTheStandbyTakesOver: the holder's connection dies
// (its backend is terminated); the holder learns it from Lost, and a standby gets
// the lock.
func TestLockLossIsReportedAndTheStandbyTakesOver(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	cfg := connConfig(t, url)
	first := tryLock(t, cfg)
	observer := pgtest.Connect(t, url)
	holder := lockHolderPID(t, observer)
	standby := startStandby(t, cfg)

	if _, err := observer.Exec(t.Context(), "SELECT pg_terminate_backend($1)", holder); err != nil {
		t.Fatal(err)
	}
	select {
	case <-first.Lost():
		if first.Err() == nil {
			t.Error("Lost is closed but Err is nil; want the reason")
		}
	case <-time.After(waitFor):
		t.Fatalf("Lost not closed within %v of the lock's backend being terminated", waitFor)
	}
	awaitStandby(t, standby)
	if pid := lockHolderPID(t, observer); pid == holder {
		t.Fatalf("lock still held by the terminated backend %d", pid)
	}
}

// standby is a WaitLock running in the background.
type standby struct {
	done chan struct{} // closed when WaitLock has returned
	lock *pgqueue.Lock
	err  error
}

func startStandby(t *testing.T, cfg *pgx.ConnConfig) *standby {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &standby{done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.lock, s.err = pgqueue.WaitLock(ctx, cfg, nil)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
			if s.lock != nil {
				_ = s.lock.Release(context.Background())
			}
		case <-time.After(waitFor):
			t.Errorf("standby did not stop within %v of its context being cancelled", waitFor)
		}
	})
	return s
}

func awaitStandby(t *testing.T, s *standby) *pgqueue.Lock {
	t.Helper()
	select {
	case <-s.done:
		if s.err != nil {
			t.Fatalf("standby: %v", s.err)
		}
		return s.lock
	case <-time.After(waitFor):
		t.Fatalf("standby did not get the lock within %v", waitFor)
		return nil
	}
}

func TestStandbyStopsWhenCancelled(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	cfg := connConfig(t, url)
	tryLock(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	l, err := pgqueue.WaitLock(ctx, cfg, nil)
	if l != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitLock on a held lock = %v, %v; want context.DeadlineExceeded", l, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("WaitLock took %v to notice its context ended, want well under its 1s poll plus margin", d)
	}
}
