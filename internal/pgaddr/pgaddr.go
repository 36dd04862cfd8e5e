// Package pgaddr names the server, database and user a connection goes to,
// as an operator reads them in an error line. It must never connect, nor
// change the configuration it is given.
package pgaddr

import (
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// Where says "PostgreSQL at HOST:PORT (database D, user U)" for c. A
// configuration without a database goes to the one named after its user, as
// the server does: an empty name would send the operator looking for a
// database "" that nothing asked for.
func Where(c *pgconn.Config) string {
	return fmt.Sprintf("PostgreSQL at %s:%d (database %q, user %q)", c.Host, c.Port, Database(c), c.User)
}

// Database is the database c connects to: its own, or its user's name when
// it names none (libpq's default).
func Database(c *pgconn.Config) string {
	if c.Database == "" {
		return c.User
	}
	return c.Database
}
