package dispatch_test

import (
	"context"
	"os"
	"testing"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/privatepg"
)

// privatePG is a PostgreSQL server of one test's own (internal/testenv/privatepg), so the
// test may crash and restart it without disturbing the shared server the other
// tests use.
type privatePG struct{ *privatepg.Server }

// startPrivatePostgres starts a private server and stops and removes it when
// the test ends (showing its log if the test failed).
func startPrivatePostgres(t *testing.T) *privatePG {
	t.Helper()
	s, err := privatepg.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(s.LogFile()); err == nil {
				t.Logf("private PostgreSQL log:\n%s", b)
			}
		}
		if err := s.Stop(); err != nil {
			t.Errorf("stop the private PostgreSQL: %v", err)
		}
	})
	return &privatePG{s}
}

// migrated applies the PEPSI schema to the postgres database and returns its URL.
func (pg *privatePG) migrated(t *testing.T) string {
	t.Helper()
	if err := pg.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return pg.URL()
}

// restart restarts the server with pg_ctl's shutdown mode ("immediate" is a
// crash) and returns once it accepts connections again.
func (pg *privatePG) restart(t *testing.T, mode string) {
	t.Helper()
	if err := pg.Restart(mode); err != nil {
		t.Fatal(err)
	}
}
