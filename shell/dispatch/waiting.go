package dispatch

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pepsi-pipeline/pepsi/internal/pgaddr"
)

// How often a dispatcher that cannot reach its database to take the lock says
// that it still waits: the first reminder after waitReportFirst, each next one
// twice as late, up to every waitReportMax. Often enough that an operator who
// looks at the log sees it is waiting, not hung; rare enough that a long outage
// does not flood it. Tests shorten them.
var (
	waitReportFirst = 10 * time.Second
	waitReportMax   = time.Minute
)

// dbWait reports acquire's failed attempts to reach the database: the first at
// once, then a reminder when one is due, each naming the server and database
// it waits for, since when, and the latest error (which changes: a server that
// is down, then starting, then a database that does not exist yet).
type dbWait struct {
	log      *slog.Logger
	server   string // host:port
	database string
	since    time.Time // of the first failure; zero before it
	next     time.Time // when the next reminder is due
	every    time.Duration
	attempts int
}

func newDBWait(log *slog.Logger, cfg *pgx.ConnConfig) *dbWait {
	return &dbWait{log: log, server: fmt.Sprintf("%s:%d", cfg.Host, cfg.Port), database: pgaddr.Database(&cfg.Config)}
}

// failed notes one failed attempt, err, and logs it if a report is due.
func (w *dbWait) failed(err error) {
	now := time.Now()
	w.attempts++
	if w.since.IsZero() {
		w.since, w.every = now, waitReportFirst
		w.next = now.Add(w.every)
		msg := "cannot reach the database to take the dispatcher lock; retrying"
		if loginRefused(err) {
			// The server answered: the network is not what to look at.
			msg = "the database refused this dispatcher's login (its role, password or pg_hba.conf); retrying"
		}
		w.log.Warn(msg, "server", w.server, "database", w.database, "err", err)
		return
	}
	if now.Before(w.next) {
		return
	}
	w.log.Warn("still waiting for the database to take the dispatcher lock",
		"server", w.server, "database", w.database, "since", w.since.Format(time.RFC3339),
		"waited", now.Sub(w.since).Round(time.Second).String(), "attempts", w.attempts, "err", err)
	w.every = min(2*w.every, waitReportMax)
	w.next = now.Add(w.every)
}

// loginRefused says whether err is the server refusing the connection's
// login (SQLSTATE class 28: a role it does not know, a wrong password, no
// pg_hba.conf entry that lets it in).
func loginRefused(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && strings.HasPrefix(pe.Code, "28")
}
