package store

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// IngressChannel is the channel the queue's insert trigger, and every tool that
// makes rows pending, notifies.
const IngressChannel = "ingress"

// Notice is what Listen reports to its handler.
type Notice int

const (
	// Listening: the first LISTEN is in place; from now on every notification is
	// reported. The daemon starts the core only after it, so no insert made after
	// its first claim can go unnoticed.
	Listening Notice = iota + 1
	// Notified: a notification arrived on the ingress channel.
	Notified
	// Down: the connection was lost or could not be made. Reported once per
	// outage, however many reconnects fail.
	Down
	// Up: LISTEN is in place again after an outage. Notifications sent during the
	// outage were lost, so work may be pending: the daemon reports
	// core.DatabaseUp.
	Up
)

func (n Notice) String() string {
	switch n {
	case Listening:
		return "listening"
	case Notified:
		return "notified"
	case Down:
		return "down"
	case Up:
		return "up"
	}
	return fmt.Sprintf("notice(%d)", int(n))
}

// Reconnect backoff of the listener: doubling from listenBackoffMin, capped at
// listenBackoffMax, back to the minimum once a connection works.
const (
	listenBackoffMin = 100 * time.Millisecond
	listenBackoffMax = 5 * time.Second
)

// healthTiming says how a dedicated connection (the listener's, the lock's) is
// watched. A connection whose peer vanished without a reset sends no error; so
// after idleCheck without traffic it is checked with a query that must answer
// within checkTimeout, or a silent network partition would go unnoticed until
// TCP keepalive gave up. connectTimeout bounds connecting (and LISTEN), which
// would otherwise hang as long as the operating system lets a connect hang.
type healthTiming struct {
	idleCheck, checkTimeout, connectTimeout time.Duration
}

// listenTiming is the listener's: a missed notification costs at most a poll
// interval, so a check every half minute is plenty.
var listenTiming = healthTiming{idleCheck: 30 * time.Second, checkTimeout: 5 * time.Second, connectTimeout: 10 * time.Second}

// Listen keeps a dedicated connection (made from config, never from the pool,
// since a pooled connection's LISTEN would end when it is returned) LISTENing on
// the ingress channel, and calls handle for each Notice, from Listen's own
// goroutine, in order. handle must not block for long (a non-blocking send on a
// channel of one is what the daemon needs: notifications coalesce into "there is
// work").
//
// On connection loss it reconnects with capped exponential backoff and LISTENs
// again. It logs one warning when an outage starts and one info line with its
// duration when it ends. It returns ctx.Err() promptly once ctx is done.
func Listen(ctx context.Context, config *pgx.ConnConfig, log *slog.Logger, handle func(Notice)) error {
	return listen(ctx, config, log, handle, listenTiming)
}

func listen(ctx context.Context, config *pgx.ConnConfig, log *slog.Logger, handle func(Notice), timing healthTiming) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	backoff := listenBackoffMin
	var downSince time.Time // zero while not in an outage
	listened := false
	for {
		conn, err := listenConn(ctx, config, timing.connectTimeout)
		if err == nil {
			if !downSince.IsZero() {
				log.Info("ingress listener is back", "outage", time.Since(downSince).Round(time.Millisecond))
				downSince = time.Time{}
			}
			if listened {
				handle(Up)
			} else {
				handle(Listening)
				listened = true
			}
			backoff = listenBackoffMin
			err = waitNotifications(ctx, conn, handle, timing)
			closeQuietly(conn)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if downSince.IsZero() {
			downSince = time.Now()
			log.Warn("ingress listener lost the database; reconnecting", "err", err)
			handle(Down)
			if conn != nil {
				// A connection that worked was lost: most often that one
				// session was ended while the server is fine. Reconnect at
				// once, since until then no notification is heard.
				continue
			}
		}
		if err := sleep(ctx, backoff); err != nil {
			return err
		}
		backoff = min(2*backoff, listenBackoffMax)
	}
}

// listenConn connects and LISTENs, within timeout.
func listenConn(ctx context.Context, config *pgx.ConnConfig, timeout time.Duration) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, config)
	if err != nil {
		return nil, fmt.Errorf("listen: connect: %w", err)
	}
	if err := keepWhileIdle(ctx, conn); err != nil { // idle by design, as the lock's
		closeQuietly(conn)
		return nil, fmt.Errorf("listen: %w", err)
	}
	if _, err := conn.Exec(ctx, listenSQL); err != nil {
		closeQuietly(conn)
		return nil, fmt.Errorf("listen: %w", err)
	}
	return conn, nil
}

// waitNotifications reports notifications until the connection fails or ctx is
// done, checking an idle connection every timing.idleCheck.
func waitNotifications(ctx context.Context, conn *pgx.Conn, handle func(Notice), timing healthTiming) error {
	for {
		wctx, cancel := context.WithTimeout(ctx, timing.idleCheck)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			if n.Channel == IngressChannel {
				handle(Notified)
			}
			continue
		case ctx.Err() != nil:
			return ctx.Err()
		case wctx.Err() != nil && !conn.IsClosed():
			cctx, cancel := context.WithTimeout(ctx, timing.checkTimeout)
			err = conn.Ping(cctx)
			cancel()
			if err == nil {
				continue
			}
		}
		return fmt.Errorf("listen: %w", err)
	}
}

// closeQuietly closes a connection that is being given up on; a failure to say
// goodbye to the server changes nothing.
func closeQuietly(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}
