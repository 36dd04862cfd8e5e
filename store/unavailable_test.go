package store_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pepsi-pipeline/pepsi/store"
)

// Unavailable tells the database not answering (nothing reached it, the
// connection broke, a deadline passed, or its SQLSTATE says it is going
// away, starting or out of connections) from the database refusing what was
// asked (any other SQLSTATE) and from errors of PEPSI's own.
func TestUnavailableTellsADatabaseThatDoesNotAnswerFromARefusal(t *testing.T) {
	t.Parallel()
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{fmt.Errorf("retry: %w", refused), true},
		{fmt.Errorf("retry: %w", io.ErrUnexpectedEOF), true},
		{fmt.Errorf("retry: %w", context.DeadlineExceeded), true},
		{fmt.Errorf("retry: %w", net.ErrClosed), true},
		{&pgconn.PgError{Code: "08006"}, true},
		{&pgconn.PgError{Code: "53300"}, true},
		{&pgconn.PgError{Code: "57P01"}, true},
		{&pgconn.PgError{Code: "57P03"}, true},
		{&pgconn.PgError{Code: "57P05"}, true},  // idle_session_timeout
		{&pgconn.PgError{Code: "25006"}, true},  // read-only: a standby
		{&pgconn.PgError{Code: "57014"}, false}, // a statement cancelled: it answered
		{fmt.Errorf("retry: %w", &pgconn.PgError{Code: "42P01"}), false},
		{&pgconn.PgError{Code: "23505"}, false},
		{errors.New("history: the store's connection cannot begin a transaction"), false},
		{store.ErrNotFound, false},
	} {
		if got := store.Unavailable(c.err); got != c.want {
			t.Errorf("Unavailable(%v) = %v; want %v", c.err, got, c.want)
		}
	}
}

// Proves: ReadOnly and Canceled name their SQLSTATEs (25006, 57014), through
// wrapping, and nothing else.
func TestReadOnlyAndCanceledNameTheirStates(t *testing.T) {
	for _, c := range []struct {
		err                error
		readOnly, canceled bool
	}{
		{fmt.Errorf("resolve: %w", &pgconn.PgError{Code: "25006"}), true, false},
		{fmt.Errorf("insert: %w", &pgconn.PgError{Code: "57014"}), false, true},
		{&pgconn.PgError{Code: "57P01"}, false, false},
		{errors.New("25006"), false, false},
		{nil, false, false},
	} {
		if got := store.ReadOnly(c.err); got != c.readOnly {
			t.Errorf("ReadOnly(%v) = %v, want %v", c.err, got, c.readOnly)
		}
		if got := store.Canceled(c.err); got != c.canceled {
			t.Errorf("Canceled(%v) = %v, want %v", c.err, got, c.canceled)
		}
	}
}
