package pgqueue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/core"
)

// GateKey is the advisory lock that says whether the dispatcher waits for work
// ("pepsgate"). The dispatcher holds it exclusively while it waits (core.Rest,
// until core.Busy); the queue's insert trigger (schema 4) tries to take it shared
// for its transaction and notifies ingress only when it cannot. The SQL of the
// trigger spells the same number: keep them equal.
const GateKey int64 = 0x7065707367617465

// gateTiming: the gate's connection is watched like the listener's.
var gateTiming = listenTiming

// Gate executes core.Rest and core.Busy on a dedicated connection (a session
// lock must not live on a pooled connection). Run it in its own goroutine with
// RunGate; send it the commands in the order the core gave them.
type Gate struct {
	ops chan core.Command
}

// NewGate returns a gate whose commands are queued up to a small bound (the core
// has at most one Rest outstanding and sends Busy only after Resting).
func NewGate() *Gate { return &Gate{ops: make(chan core.Command, 4)} }

// Do queues a Rest or a Busy. It never blocks for long: the core sends at most
// two before an answer.
func (g *Gate) Do(cmd core.Command) { g.ops <- cmd }

// Run executes the gate's commands until ctx is done and reports core.Resting
// (the answer to each Rest) and core.RestLost (the connection died while the
// gate was held) through report, in order. A Rest connects if need be and waits
// for the lock as long as producers hold it shared (each such producer notifies
// meanwhile); a Busy unlocks. Closing the connection releases the lock, so any
// failure of the connection leaves the gate free, which is what RestLost says.
func (g *Gate) Run(ctx context.Context, config *pgx.ConnConfig, log *slog.Logger, report func(core.Event)) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var conn *pgx.Conn
	held := false
	defer func() {
		if conn != nil {
			closeQuietly(conn)
		}
	}()
	for {
		// Watch the connection until the next command: while the gate is held
		// its death is news for the core; otherwise it is only replaced.
		var dead <-chan error
		stopWatch := func() {}
		if conn != nil {
			wctx, cancel := context.WithCancel(ctx)
			ch := make(chan error, 1)
			done := make(chan struct{})
			c := conn
			go func() {
				defer close(done)
				ch <- watchConn(wctx, c, gateTiming)
			}()
			dead = ch
			stopWatch = func() { cancel(); <-done }
		}
		var op core.Command
		select {
		case <-ctx.Done():
			stopWatch()
			return
		case err := <-dead:
			stopWatch()
			closeQuietly(conn)
			conn = nil
			if held {
				held = false
				log.Warn("the gate's connection died; producers stop notifying until the dispatcher waits again", "err", err)
				report(core.RestLost{})
			}
			continue
		case op = <-g.ops:
			stopWatch()
		}
		if conn != nil && conn.IsClosed() {
			conn = nil
			if held {
				held = false
				report(core.RestLost{})
			}
		}
		switch op.(type) {
		case core.Rest:
			if held {
				report(core.Resting{})
				continue
			}
			var err error
			if conn == nil {
				conn, err = gateConn(ctx, config)
			}
			if err == nil {
				// Waits for every producer holding the gate shared; producers
				// that come meanwhile cannot take it and notify.
				_, err = conn.Exec(ctx, advisoryLockSQL, GateKey)
			}
			if err != nil {
				if conn != nil {
					closeQuietly(conn)
					conn = nil
				}
				if ctx.Err() != nil {
					return
				}
				report(core.Resting{Err: err.Error()})
				continue
			}
			held = true
			report(core.Resting{})
		case core.Busy:
			if !held || conn == nil {
				continue
			}
			held = false
			cctx, cancel := context.WithTimeout(ctx, gateTiming.checkTimeout)
			_, err := conn.Exec(cctx, advisoryUnlockSQL, GateKey)
			cancel()
			if err != nil {
				// Closing the session releases the lock as well.
				closeQuietly(conn)
				conn = nil
			}
		default:
			panic(fmt.Sprintf("pgqueue: gate: %T is not a gate command", op))
		}
	}
}

// gateConn connects for the gate within the connect timeout. Its
// application_name is the dispatcher's with " gate" appended, so an operator
// (or a test) can tell it from the dispatcher lock's session.
func gateConn(ctx context.Context, config *pgx.ConnConfig) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, gateTiming.connectTimeout)
	defer cancel()
	config = config.Copy()
	if config.RuntimeParams == nil {
		config.RuntimeParams = map[string]string{}
	}
	name := config.RuntimeParams["application_name"]
	if name == "" {
		name = AppName()
	}
	config.RuntimeParams["application_name"] = name + " gate"
	conn, err := pgx.ConnectConfig(ctx, config)
	if err != nil {
		return nil, fmt.Errorf("gate: connect: %w", err)
	}
	return conn, nil
}

// watchConn blocks on an idle connection, which receives nothing unless it
// fails (a terminated backend sends an error at once), and checks it with a
// query when it has been quiet for timing.idleCheck. It returns nil when ctx is
// done, and the error once the connection failed.
func watchConn(ctx context.Context, conn *pgx.Conn, timing healthTiming) error {
	for {
		wctx, cancel := context.WithTimeout(ctx, timing.idleCheck)
		_, err := conn.WaitForNotification(wctx)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			continue
		}
		if wctx.Err() != nil && !conn.IsClosed() {
			cctx, cancel := context.WithTimeout(ctx, timing.checkTimeout)
			err = conn.Ping(cctx)
			cancel()
			if err == nil {
				continue
			}
			if ctx.Err() != nil {
				return nil
			}
		}
		if err == nil {
			err = errors.New("connection closed")
		}
		return err
	}
}
