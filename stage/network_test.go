package stage_test

import (
	"context"
	"sync"
	"testing"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/stage"
)

// A stage's connection has the dispatcher's bounds on a silent network
// (internal/pgnet): the server ends a stage session it stops hearing from, with
// its row locks, after the same time as a dispatcher's, and the stage's side
// gives up on a silent server.
func TestTheStagesConnectionBoundsASilentNetworkAsTheDispatchersDoes(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	ids := insertRunning(t, conn, "enrich", "x")
	var mu sync.Mutex
	got := map[string]string{}
	w := startWorker(t, stage.Options{Stage: "enrich", DB: url, Handlers: map[string]stage.Handler{
		"enrich": func(ctx context.Context, m *stage.Message) stage.Result {
			mu.Lock()
			defer mu.Unlock()
			for _, name := range []string{"tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count", "tcp_user_timeout"} {
				var v string
				if err := m.Tx.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
					return stage.Error(err.Error())
				}
				got[name] = v
			}
			return stage.Done()
		},
	}})
	w.send(idLines(ids))
	if a := w.answer(); a != "0" {
		t.Fatalf("answer %q, want 0", a)
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[string]string{"tcp_keepalives_idle": "20", "tcp_keepalives_interval": "5", "tcp_keepalives_count": "4", "tcp_user_timeout": "40000"}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("the stage's session has %s = %q, want %q (the dispatcher's bound)", name, got[name], v)
		}
	}
}
