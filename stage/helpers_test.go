package stage_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/lockedbuf"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/stage"
)

// answerWait bounds every wait for a status line or for Run to return.
const answerWait = 15 * time.Second

// worker is a stage.Run driven through pipes, as pepsi-dispatch drives a process.
type worker struct {
	t       *testing.T
	in      *io.PipeWriter
	lines   chan string
	done    chan error
	logs    *lockedbuf.Buffer
	stopped bool
}

// startWorker runs stage.Run with o (In, Out and Log are supplied here) until the
// test ends.
func startWorker(t *testing.T, o stage.Options) *worker {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	logs := &lockedbuf.Buffer{}
	o.In, o.Out = inR, outW
	o.Log = slog.New(slog.NewTextHandler(logs, nil))
	ctx, cancel := context.WithCancel(context.Background())
	w := &worker{t: t, in: inW, lines: make(chan string, 1000), done: make(chan error, 1), logs: logs}
	go func() {
		err := stage.Run(ctx, o)
		outW.Close()
		w.done <- err
	}()
	go func() {
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			w.lines <- sc.Text()
		}
		close(w.lines)
	}()
	t.Cleanup(func() {
		cancel()
		inW.Close()
		outR.Close()
		if !w.stopped {
			select {
			case <-w.done:
			case <-time.After(answerWait):
				t.Errorf("stage.Run did not return within %v of the end of the test", answerWait)
			}
		}
		if t.Failed() {
			t.Logf("worker log:\n%s", logs.String())
		}
	})
	return w
}

// send writes s to the worker's standard input in one write.
func (w *worker) send(s string) {
	w.t.Helper()
	if _, err := w.in.Write([]byte(s)); err != nil {
		w.t.Fatalf("write %q to the worker: %v", s, err)
	}
}

// answer waits for the next status line.
func (w *worker) answer() string {
	w.t.Helper()
	select {
	case line, ok := <-w.lines:
		if !ok {
			w.t.Fatalf("worker closed its output; want another status line (log:\n%s)", w.logs.String())
		}
		return line
	case <-time.After(answerWait):
		w.t.Fatalf("no status line within %v (log:\n%s)", answerWait, w.logs.String())
	}
	return ""
}

// closeInput ends standard input and waits for Run to return; it returns Run's
// error and every line written after the ones already read.
func (w *worker) closeInput() (rest []string, err error) {
	w.t.Helper()
	w.in.Close()
	deadline := time.After(answerWait)
	for {
		select {
		case line, ok := <-w.lines:
			if !ok {
				select {
				case err = <-w.done:
					w.stopped = true
					return rest, err
				case <-deadline:
					w.t.Fatalf("stage.Run did not return within %v of the end of its input", answerWait)
				}
			}
			rest = append(rest, line)
		case <-deadline:
			w.t.Fatalf("output not closed within %v of the end of input (got %q)", answerWait, rest)
		}
	}
}

// row is a queue row as a test sees it.
type row struct {
	Stage     string
	Status    string
	Timeout   *time.Time
	State     map[string]any
	UpdatedAt time.Time
}

// insert adds a row and returns its id.
func insert(t *testing.T, conn *pgx.Conn, stageName, status, payload, state string) int64 {
	t.Helper()
	if state == "" {
		state = "{}"
	}
	var id int64
	err := conn.QueryRow(context.Background(),
		`INSERT INTO pepsi.queue (stage, status, payload, state) VALUES ($1, $2, $3, $4) RETURNING ingress_id`,
		stageName, status, []byte(payload), state).Scan(&id)
	if err != nil {
		t.Fatalf("insert row: %v", err)
	}
	return id
}

// insertRunning adds rows running at stageName, one per payload.
func insertRunning(t *testing.T, conn *pgx.Conn, stageName string, payloads ...string) []int64 {
	t.Helper()
	ids := make([]int64, len(payloads))
	for i, p := range payloads {
		ids[i] = insert(t, conn, stageName, "running", p, "")
	}
	return ids
}

// withOperator makes a fresh migrated database and returns its URL, a
// connection for the test and one for an operator who changes rows behind
// the stage's back.
func withOperator(t *testing.T) (url string, conn, operator *pgx.Conn) {
	t.Helper()
	url, conn = pgtest.NewMigratedConn(t)
	return url, conn, pgtest.Connect(t, url)
}

// wantRunningAtParse checks that the rows of ids are still running at stage
// parse, because of why.
func wantRunningAtParse(t *testing.T, conn *pgx.Conn, why string, ids ...int64) {
	t.Helper()
	for _, id := range ids {
		if r := get(t, conn, id); r.Stage != "parse" || r.Status != "running" {
			t.Errorf("row %d is %s at %s, want running at parse (%s)", id, r.Status, r.Stage, why)
		}
	}
}

// get reads a row; it fails the test if the row is missing.
func get(t *testing.T, conn *pgx.Conn, id int64) row {
	t.Helper()
	var r row
	var state []byte
	err := conn.QueryRow(context.Background(),
		`SELECT stage, status, timeout, state, updated_at FROM pepsi.queue WHERE ingress_id = $1`, id).
		Scan(&r.Stage, &r.Status, &r.Timeout, &state, &r.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("row %d is missing", id)
	}
	if err != nil {
		t.Fatalf("read row %d: %v", id, err)
	}
	d := json.NewDecoder(bytes.NewReader(state))
	d.UseNumber()
	if err := d.Decode(&r.State); err != nil {
		t.Fatalf("row %d state %s: %v", id, state, err)
	}
	return r
}
