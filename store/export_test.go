package store

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// The statements, for the tests that EXPLAIN them.
const (
	ClaimSQL                    = claimSQL
	ClaimLimitsSQL              = claimLimitsSQL
	SettledSQL                  = settledSQL
	ResetOrphansSQL             = resetOrphansSQL
	WakeSQL                     = wakeSQL
	ResolveSQL                  = resolveSQL
	ResolveNoEmitsSQL           = resolveNoEmitsSQL
	ResolveKeylessEmitsSQL      = resolveKeylessEmitsSQL
	ResolveAgainSQL             = resolveAgainSQL
	ResolveNoEmitsAgainSQL      = resolveNoEmitsAgainSQL
	ResolveKeylessEmitsAgainSQL = resolveKeylessEmitsAgainSQL
	OverSQL                     = overSQL
	ReleaseLockSQL              = releaseLockSQL
)

// ReleaseSQL is the release statement without releaseAll, for the test that
// EXPLAINs it.
var ReleaseSQL = releaseStatement(false)

// PageMessageSQL is pepsi-httpd's read of one message, for the test that
// EXPLAINs it.
var PageMessageSQL = pageMessageSQL

// ListenTimed is Listen with the given health-check timing, for the tests of a
// silent network partition.
func ListenTimed(ctx context.Context, config *pgx.ConnConfig, log *slog.Logger, handle func(Notice), idleCheck, checkTimeout time.Duration) error {
	return listen(ctx, config, log, handle, healthTiming{idleCheck: idleCheck, checkTimeout: checkTimeout, connectTimeout: 2 * time.Second})
}

// TryLockTimed is TryLock with the given health-check timing.
func TryLockTimed(ctx context.Context, config *pgx.ConnConfig, idleCheck, checkTimeout time.Duration) (*Lock, error) {
	return tryLockTimed(ctx, config, nil, healthTiming{idleCheck: idleCheck, checkTimeout: checkTimeout, connectTimeout: 2 * time.Second})
}

// WaitLockTimed is WaitLock with the given recheck period.
func WaitLockTimed(ctx context.Context, config *pgx.ConnConfig, log *slog.Logger, recheck time.Duration) (*Lock, error) {
	return waitLockTimed(ctx, config, log, recheck)
}

// AppNameFor is AppName for a given host and pid.
func AppNameFor(host string, pid int) string { return appName(host, pid) }

// AddDoubt puts session b on q's list of sessions in doubt, as a lost reply
// does, for the tests of whom endDoubt ends.
func (q *Queue) AddDoubt(b Backend) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.doubt = append(q.doubt, b)
}

// Doubt lists the sessions q holds in doubt.
func (q *Queue) Doubt() []Backend {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]Backend(nil), q.doubt...)
}

// SetLockWaitAfter sets how long a queue transaction runs before q looks
// for the sessions it waits for (watchLockWait).
func (q *Queue) SetLockWaitAfter(d time.Duration) { q.lockWaitAfter = d }
