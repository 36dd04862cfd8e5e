package stage_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/stage"
)

// A handler that runs its statements on Message.Tx.Conn() (as code written
// against *pgx.Conn does) must get the message's transaction even when the
// transaction could not begin because the row changed under the pass: a
// statement there must not autocommit on its own, since the pass then runs
// again and its writes would be doubled (or kept for a pass that answers 1).
func TestStatementsOnTxConnAfterTheRowChangedDoNotCommit(t *testing.T) {
	t.Parallel()
	url, conn, operator := withOperator(t)
	if _, err := conn.Exec(context.Background(), "CREATE TABLE side (id bigint, run int)"); err != nil {
		t.Fatal(err)
	}
	ids := insertRunning(t, conn, "parse", "x")
	runs := 0
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(ctx context.Context, m *stage.Message) stage.Result {
			runs++
			if runs == 1 {
				// The row changes after it was read, before the handler's first statement.
				if _, err := operator.Exec(ctx, `UPDATE pepsi.queue SET state = '{"operator": "was here"}' WHERE ingress_id = $1`, m.ID); err != nil {
					return stage.Error(err.Error())
				}
			}
			// The handler's error is not checked: what matters is where the
			// statement runs.
			_, _ = m.Tx.Conn().Exec(ctx, "INSERT INTO side VALUES ($1, $2)", m.ID, runs)
			if runs == 1 {
				// The changed row is not held locked while the handler goes on: a
				// dispatcher that reset and claims it again must not wait for it.
				if _, err := operator.Exec(ctx, "SELECT 1 FROM pepsi.queue WHERE ingress_id = $1 FOR UPDATE NOWAIT", m.ID); err != nil {
					t.Errorf("lock the changed row from another session: %v", err)
				}
			}
			return stage.Done()
		}}})

	w.send(idLines(ids))
	if got := w.answer(); got != "0" {
		t.Fatalf("answer = %q, want \"0\"", got)
	}
	rows, err := conn.Query(context.Background(), "SELECT id || ':' || run FROM side ORDER BY run")
	if err != nil {
		t.Fatal(err)
	}
	side, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{fmt.Sprintf("%d:2", ids[0])}; fmt.Sprint(side) != fmt.Sprint(want) {
		t.Errorf("side table = %v, want %v (only the run whose transition committed; the first run's insert must not commit outside the message's transaction)", side, want)
	}
}

// Every fused stage's name goes on the status line ("0 NAME:MICROS"), which
// the dispatcher parses with core.ParseStatus: a name it cannot read there makes
// every such answer a protocol error (the worker is killed after its
// transition committed). Run must refuse such a name at start, as a
// configuration error.
func TestFusedStageNameTheDispatcherCannotReadIsRefused(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"tag.v2", "tag:v2", "tag v2", "étiquette", strings.Repeat("t", 64)} {
		line := "0 " + name + ":12"
		if _, err := core.ParseStatus(line); err == nil {
			t.Fatalf("core.ParseStatus(%q) accepts it; this case tests nothing", line)
		}
		err := stage.Run(context.Background(), stage.Options{Stage: "enrich", Fused: []string{name},
			DB: "postgres://127.0.0.1:1/x", In: strings.NewReader(""), Out: &strings.Builder{},
			Handlers: map[string]stage.Handler{"enrich": advanceTo(name), name: advanceTo("deliver")}})
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", name)) || strings.Contains(err.Error(), "connect") {
			t.Errorf("Run with fused stage %q = %v, want a configuration error naming it (before connecting)", name, err)
		}
	}
}

// A handler that leaves rows open on Message.Tx.Conn() in a pass that is run
// again (its row changed) must not leave the connection busy for the messages
// after it.
func TestRowsLeftOpenOnTxConnDoNotBreakTheNextMessages(t *testing.T) {
	t.Parallel()
	url, conn, operator := withOperator(t)
	ids := insertRunning(t, conn, "parse", "leaky", "next")
	runs := 0
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(ctx context.Context, m *stage.Message) stage.Result {
			if string(m.Payload) == "leaky" {
				runs++
				if runs == 1 {
					if _, err := operator.Exec(ctx, `UPDATE pepsi.queue SET state = '{"operator": "was here"}' WHERE ingress_id = $1`, m.ID); err != nil {
						return stage.Error(err.Error())
					}
					rows, err := m.Tx.Conn().Query(ctx, "SELECT generate_series(1, 3)")
					if err == nil {
						rows.Next() // and never closed
					}
				}
			}
			return stage.Advance("enrich")
		}}})

	w.send(idLines(ids))
	for i := range ids {
		if got := w.answer(); got != "0 >enrich" {
			t.Errorf("answer %d = %q, want \"0 >enrich\"", i, got)
		}
	}
}
