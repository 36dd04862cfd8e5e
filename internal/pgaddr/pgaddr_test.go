package pgaddr

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestWhereNamesTheDatabaseTheServerUses: without a database, the user's name
// is the one the server connects to, and the line says so.
func TestWhereNamesTheDatabaseTheServerUses(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"postgres://alice@db.example:6543/orders", `PostgreSQL at db.example:6543 (database "orders", user "alice")`},
		{"postgres://alice@db.example:6543", `PostgreSQL at db.example:6543 (database "alice", user "alice")`},
	} {
		c, err := pgconn.ParseConfig(tc.url)
		if err != nil {
			t.Fatalf("%s: %v", tc.url, err)
		}
		if got := Where(c); got != tc.want {
			t.Errorf("Where(%s) = %s; want %s", tc.url, got, tc.want)
		}
	}
}
