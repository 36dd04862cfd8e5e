package store

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
// Run; send it the commands in the order the core gave them.
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
	r := &gateRun{config: config, log: log, report: report}
	defer func() {
		if r.conn != nil {
			closeQuietly(r.conn)
		}
	}()
	for {
		op, ok := r.next(ctx, g.ops)
		if !ok {
			return
		}
		switch op.(type) {
		case core.Rest:
			if !r.rest(ctx) {
				return
			}
		case core.Busy:
			r.busy(ctx)
		default:
			panic(fmt.Sprintf("store: gate: %T is not a gate command", op))
		}
	}
}

// gateRun is the state of one Gate.Run: its connection, and whether the gate
// is held on it.
type gateRun struct {
	config *pgx.ConnConfig
	log    *slog.Logger
	report func(core.Event)
	conn   *pgx.Conn // nil until a Rest connects, and after it failed
	held   bool
}

// next waits for the next command, watching the connection meanwhile: while
// the gate is held its death is news for the core; otherwise it is only
// replaced. It answers false once ctx is done.
func (r *gateRun) next(ctx context.Context, ops <-chan core.Command) (core.Command, bool) {
	for {
		var dead <-chan error
		stopWatch := func() {}
		if r.conn != nil {
			wctx, cancel := context.WithCancel(ctx)
			ch := make(chan error, 1)
			done := make(chan struct{})
			c := r.conn
			go func() {
				defer close(done)
				ch <- watchConn(wctx, c, gateTiming)
			}()
			dead = ch
			stopWatch = func() { cancel(); <-done }
		}
		select {
		case <-ctx.Done():
			stopWatch()
			return nil, false
		case err := <-dead:
			stopWatch()
			closeQuietly(r.conn)
			r.conn = nil
			if r.held {
				r.held = false
				r.log.Warn("the gate's connection died; producers stop notifying until the dispatcher waits again", "err", err)
				r.report(core.RestLost{})
			}
		case op := <-ops:
			stopWatch()
			if r.conn != nil && r.conn.IsClosed() {
				r.conn = nil
				if r.held {
					r.held = false
					r.report(core.RestLost{})
				}
			}
			return op, true
		}
	}
}

// rest takes the gate (connecting if need be) and answers core.Resting, with
// the error if it could not. It answers false if ctx ended it.
func (r *gateRun) rest(ctx context.Context) bool {
	if r.held {
		r.report(core.Resting{})
		return true
	}
	var err error
	if r.conn == nil {
		r.conn, err = gateConn(ctx, r.config)
	}
	if err == nil {
		// Waits for every producer holding the gate shared; producers that
		// come meanwhile cannot take it and notify.
		_, err = r.conn.Exec(ctx, advisoryLockSQL, GateKey)
	}
	if err != nil {
		if r.conn != nil {
			closeQuietly(r.conn)
			r.conn = nil
		}
		if ctx.Err() != nil {
			return false
		}
		r.report(core.Resting{Err: err.Error()})
		return true
	}
	r.held = true
	r.report(core.Resting{})
	return true
}

// busy gives the gate up, if it is held.
func (r *gateRun) busy(ctx context.Context) {
	if !r.held || r.conn == nil {
		return
	}
	r.held = false
	cctx, cancel := context.WithTimeout(ctx, gateTiming.checkTimeout)
	_, err := r.conn.Exec(cctx, advisoryUnlockSQL, GateKey)
	cancel()
	if err != nil {
		// Closing the session releases the lock as well.
		closeQuietly(r.conn)
		r.conn = nil
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
	if err := keepWhileIdle(ctx, conn); err != nil { // idle while the dispatcher rests
		closeQuietly(conn)
		return nil, fmt.Errorf("gate: %w", err)
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
