package store_test

import (
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/store"
)

// Proves: BoundLockWaits lowers a session's lock_timeout to its bound when
// the session has none (0) or a longer one, in whatever unit the server
// shows it (ms, s, min, h, d), and keeps a shorter one (a role's, a
// database's, the connection string's) as it is.
func TestBoundLockWaitsKeepsAShorterOneInEveryUnit(t *testing.T) {
	url := pgtest.NewMigrated(t)
	bound := store.BoundLockWaits(50 * time.Second)
	for _, c := range []struct{ before, want string }{
		{"0", "50s"}, {"50ms", "50ms"}, {"1500ms", "1500ms"}, {"5s", "5s"}, {"50s", "50s"},
		{"90s", "50s"}, {"1min", "50s"}, {"2h", "50s"}, {"1d", "50s"},
	} {
		conn := pgtest.ConnectWith(t, url, map[string]string{"lock_timeout": c.before})
		if err := bound(t.Context(), conn); err != nil {
			t.Fatalf("lock_timeout %s: %v", c.before, err)
		}
		var got string
		if err := conn.QueryRow(t.Context(), "SHOW lock_timeout").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("lock_timeout %s bounded at 50 s: %s, want %s", c.before, got, c.want)
		}
	}
}
