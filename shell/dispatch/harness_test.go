package dispatch_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/gobuild"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/lockedbuf"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/stagelog"
	"github.com/pepsi-pipeline/pepsi/shell/dispatch"
)

// binDir holds the programs TestMain builds: teststage (with its personalities
// libstage and exitstage as links to it, see internal/testenv/teststage) and
// pepsi-dispatch.
var binDir string

// TestMain builds the test stage program and the pepsi-dispatch binary once.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pepsi-dispatch-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	if err := gobuild.Into(dir, "internal/testenv/teststage", "cmd/pepsi-dispatch"); err != nil {
		fmt.Fprintf(os.Stderr, "build the test programs: %v\n", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	for _, name := range []string{"libstage", "exitstage", "eagerstage", "relaystage", "filterstage"} {
		if err := os.Symlink(filepath.Join(dir, "teststage"), filepath.Join(dir, name)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is one test's world: its own database, a configuration file in its own
// directory (where the stage programs also leave their record), and a pool to
// look at the queue.
type env struct {
	t    *testing.T
	url  string
	dir  string
	conf string
	cfg  *conf.Config
	db   *pgxpool.Pool
	// txnTimeout, if set, is the daemon's Options.TxnTimeout.
	txnTimeout time.Duration
	// workerEnv, if set, is the daemon's Options.WorkerEnv.
	workerEnv []string
}

// newEnv creates a migrated database and writes pepsi.conf: [pepsi] DATABASE
// pointing at it, then text, in which @BIN@ stands for the directory of the test
// programs and @DIR@ for the test's own directory (where pepsi.conf is).
func newEnv(t *testing.T, text string) *env {
	t.Helper()
	return newEnvAt(t, pgtest.NewMigrated(t), text)
}

// newEnvAt is newEnv on an existing migrated database.
func newEnvAt(t *testing.T, url, text string) *env {
	t.Helper()
	e := &env{t: t, url: url, dir: t.TempDir()}
	e.conf = filepath.Join(e.dir, "pepsi.conf")
	full := "[pepsi]\nDATABASE = " + url + "\n" + strings.NewReplacer("@BIN@", binDir, "@DIR@", e.dir).Replace(text)
	if err := os.WriteFile(e.conf, []byte(full), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := conf.Parse(e.conf, full)
	if err != nil {
		t.Fatalf("test configuration: %v", err)
	}
	e.cfg = cfg
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 2
	db, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatalf("test pool: %v", err)
	}
	t.Cleanup(db.Close)
	e.db = db
	return e
}

// daemon is one dispatch.Run running in the test process.
type daemon struct {
	t       *testing.T
	name    string
	signals chan os.Signal
	done    chan struct{}
	logs    *logBuffer
	code    int
	err     error
}

// start runs the dispatcher on e's configuration until stop (or the end of the
// test, which stops it and fails the test if it does not exit).
func (e *env) start() *daemon { return e.startWith("dispatcher", false) }

func (e *env) startWith(name string, standby bool) *daemon {
	d := &daemon{t: e.t, name: name, signals: make(chan os.Signal, 2), done: make(chan struct{}), logs: &logBuffer{}}
	log := slog.New(slog.NewJSONHandler(d.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	go func() {
		defer close(d.done)
		d.code, d.err = dispatch.Run(context.Background(), dispatch.Options{
			Config: e.cfg, Database: e.url, Standby: standby, Log: log, Signals: d.signals,
			TxnTimeout: e.txnTimeout, WorkerEnv: e.workerEnv,
		})
	}()
	e.t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			d.signals <- syscall.SIGTERM
			select {
			case <-d.done:
			case <-time.After(30 * time.Second):
				d.signals <- syscall.SIGTERM
				e.t.Errorf("%s did not exit within 30s of SIGTERM at the end of the test", name)
				<-d.done
			}
		}
		if e.t.Failed() {
			e.t.Logf("%s log:\n%s", name, d.logs.String())
		}
	})
	return d
}

// exitWait bounds how long a shutdown may take in these tests.
const exitWait = 30 * time.Second

// stop sends SIGTERM and returns Run's exit code and error.
func (d *daemon) stop() (int, error) {
	d.t.Helper()
	d.signals <- syscall.SIGTERM
	return d.wait(exitWait)
}

// wait waits for Run to return.
func (d *daemon) wait(timeout time.Duration) (int, error) {
	d.t.Helper()
	select {
	case <-d.done:
		return d.code, d.err
	case <-time.After(timeout):
		d.t.Fatalf("%s: Run did not return within %v", d.name, timeout)
	}
	return 0, nil
}

// stopClean stops the dispatcher and fails the test unless it exits 0.
func (d *daemon) stopClean() {
	d.t.Helper()
	if code, err := d.stop(); code != dispatch.ExitOK || err != nil {
		d.t.Errorf("%s after SIGTERM: exit %d, err %v; want exit 0, no error", d.name, code, err)
	}
}

// logBuffer collects the daemon's JSON log lines.
type logBuffer struct{ lockedbuf.Buffer }

// logLine is one decoded log record.
type logLine map[string]any

func (l logLine) msg() string { s, _ := l["msg"].(string); return s }

func (l logLine) time() time.Time {
	s, _ := l["time"].(string)
	t, _ := time.Parse(time.RFC3339Nano, s)
	return t
}

// lines returns the records whose message contains substr.
func (b *logBuffer) lines(substr string) []logLine {
	var out []logLine
	sc := bufio.NewScanner(strings.NewReader(b.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l logLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			continue
		}
		if strings.Contains(l.msg(), substr) {
			out = append(out, l)
		}
	}
	return out
}

// waitFor polls cond until it holds or timeout passes; then it fails the test
// saying what was awaited and what cond last reported.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s; last seen: %s", timeout, what, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// insert adds one message per script at stage, in order, in one statement (one
// NOTIFY), and returns their ids in order.
func (e *env) insert(stage string, scripts ...string) []int64 {
	e.t.Helper()
	rows, err := e.db.Query(context.Background(), `
		INSERT INTO pepsi.queue (stage, payload)
		SELECT $1, convert_to(s, 'UTF8') FROM unnest($2::text[]) WITH ORDINALITY AS t(s, o) ORDER BY o
		RETURNING ingress_id`, stage, scripts)
	if err != nil {
		e.t.Fatalf("insert: %v", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		e.t.Fatalf("insert: %v", err)
	}
	slices.Sort(ids)
	return ids
}

// insertN adds n messages with the same script at stage in one statement.
func (e *env) insertN(stage, script string, n int) {
	e.t.Helper()
	_, err := e.db.Exec(context.Background(), `
		INSERT INTO pepsi.queue (stage, payload)
		SELECT $1, convert_to($2, 'UTF8') FROM generate_series(1, $3)`, stage, script, n)
	if err != nil {
		e.t.Fatalf("insert: %v", err)
	}
}

// counts returns how many rows have each status.
func (e *env) counts() (map[string]int, error) {
	rows, err := e.db.Query(context.Background(), `SELECT status, count(*) FROM pepsi.queue GROUP BY status`)
	if err != nil {
		return nil, err
	}
	m := map[string]int{}
	var status string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&status, &n}, func() error { m[status] = n; return nil })
	return m, err
}

func fmtCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// waitCounts waits until the queue's status counts are exactly want.
func (e *env) waitCounts(timeout time.Duration, want map[string]int) {
	e.t.Helper()
	waitFor(e.t, timeout, "queue status counts "+fmtCounts(want), func() (bool, string) {
		got, err := e.counts()
		if err != nil {
			return false, err.Error()
		}
		return fmtCounts(got) == fmtCounts(want), fmtCounts(got)
	})
}

// row is one queue row as a test sees it.
type row struct {
	Stage, Status, Error string
	Passes               map[string]int // n_STAGE of the state: passes per stage
}

func (r row) String() string {
	return fmt.Sprintf("%s@%s (dispatch_error %q)", r.Status, r.Stage, r.Error)
}

func (e *env) row(id int64) row {
	e.t.Helper()
	var r row
	var state map[string]any
	err := e.db.QueryRow(context.Background(),
		`SELECT stage, status, coalesce(state ->> 'dispatch_error', ''), state FROM pepsi.queue WHERE ingress_id = $1`, id).
		Scan(&r.Stage, &r.Status, &r.Error, &state)
	if err != nil {
		e.t.Fatalf("row %d: %v", id, err)
	}
	r.Passes = map[string]int{}
	for k, v := range state {
		if s, ok := strings.CutPrefix(k, "n_"); ok {
			if f, ok := v.(float64); ok {
				r.Passes[s] = int(f)
			}
		}
	}
	return r
}

// expectRow fails the test unless row id has the status and stage, and a
// dispatch_error containing errPart ("" means no dispatch_error at all).
func (e *env) expectRow(id int64, status, stage, errPart string) {
	e.t.Helper()
	r := e.row(id)
	okErr := r.Error == "" && errPart == "" || errPart != "" && strings.Contains(r.Error, errPart)
	if r.Status != status || r.Stage != stage || !okErr {
		e.t.Errorf("message %d is %s; want %s@%s with dispatch_error containing %q", id, r, status, stage, errPart)
	}
}

// scalar runs a query returning one value.
func (e *env) scalar(query string, args ...any) int64 {
	e.t.Helper()
	var n int64
	if err := e.db.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
	return n
}

// Record is one line the test stage program wrote.
type Record = stagelog.Record

// records reads what the stage programs recorded so far, optionally only events
// of kind ev.
func (e *env) records(ev string) []Record {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.dir, "record"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		e.t.Fatal(err)
	}
	var out []Record
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" {
			continue
		}
		var r Record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			continue // a line being written right now
		}
		if ev == "" || r.Ev == ev {
			out = append(out, r)
		}
	}
	return out
}

// handledBy returns, per message id, the pids whose handle records name it, in order.
func (e *env) handledBy() map[int64][]int {
	m := map[int64][]int{}
	for _, r := range e.records("handle") {
		m[r.ID] = append(m[r.ID], r.PID)
	}
	return m
}

// stageStats is one row of pepsi.stage_stats.
type stageStats struct {
	Processed, Failed, Timeouts, Crashes, ProcessingUS int64
}

func (e *env) stageStats() map[string]stageStats {
	e.t.Helper()
	rows, err := e.db.Query(context.Background(), `SELECT stage, processed, failed, timeouts, crashes, processing_us FROM pepsi.stage_stats`)
	if err != nil {
		e.t.Fatal(err)
	}
	m := map[string]stageStats{}
	var s string
	var st stageStats
	_, err = pgx.ForEachRow(rows, []any{&s, &st.Processed, &st.Failed, &st.Timeouts, &st.Crashes, &st.ProcessingUS}, func() error {
		m[s] = st
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return m
}

// failsThenDone runs one worker of stage a on two messages, script and one
// that is done at once, until the first has failed and the second is done,
// and checks that the first failed with a reason containing reason. It
// returns the environment, the dispatcher stopped, and the failed message.
func failsThenDone(t *testing.T, script, reason string) (*env, int64) {
	t.Helper()
	e := newEnv(t, stages(1, 4, "a"))
	ids := e.insert("a", script, "a=done")
	d := e.start()
	e.waitCounts(30*time.Second, map[string]int{"done": 1, "failed": 1})
	d.stopClean()
	e.expectRow(ids[0], "failed", "a", reason)
	e.expectRow(ids[1], "done", "a", "")
	return e, ids[0]
}

// wantCrashes checks that each of stages counted one worker crash and
// failed messages.
func (e *env) wantCrashes(failed int64, stages ...string) {
	e.t.Helper()
	st := e.stageStats()
	for _, s := range stages {
		if st[s].Crashes != 1 || st[s].Failed != failed {
			e.t.Errorf("stage_stats %s = %+v; want crashes 1, failed %d", s, st[s], failed)
		}
	}
}

// waitStatsOf waits until the dispatcher's statistics count n messages that
// left the pipeline (a flush is asynchronous to the rows' last change).
func (e *env) waitStatsOf(n int64) {
	e.t.Helper()
	waitFor(e.t, 10*time.Second, fmt.Sprintf("statistics of %d messages", n), func() (bool, string) {
		_, left, _ := e.dispatchStats()
		return left == n, fmt.Sprintf("messages_left %d", left)
	})
}

// dispatchStats returns dispatch_stats' stage_passes, messages_left and flush_seq.
func (e *env) dispatchStats() (passes, left, seq int64) {
	e.t.Helper()
	err := e.db.QueryRow(context.Background(), `SELECT stage_passes, messages_left, flush_seq FROM pepsi.dispatch_stats`).Scan(&passes, &left, &seq)
	if err != nil {
		e.t.Fatal(err)
	}
	return
}
