// Command pepsi-soak runs a pipeline at a steady offered load for a long time and
// reports, minute by minute, whether it stays fast as the queue churns: messages
// done per minute, the backlog, pepsi.queue's dead tuples and table and index
// sizes, and pepsi-dispatch's RSS, open files, threads and goroutines. "make
// soak" runs it (30 minutes, on demand; docs/operations.md, "Vacuum and
// retention", reports its figures).
//
// The pipeline is three trivial stages (a -> b -> c -> done) served by
// pepsi-soak itself (started as "pepsi-soak worker") with the stage library, so
// every stage answers its transition; workers recycle every -max-messages
// messages. A producer inserts single messages at -rate per second (in small
// batches every 100 ms). With -rate 0 the rate is 70% of what a 20 s drain of a
// backlog measures first. Every minute it purges the finished messages older
// than -retain, as a nightly pepsi-queue purge would (scaled to the run), so the
// table's size can level off.
//
// It uses its own database (-db-name, created afresh) on the server of
// PEPSI_TEST_DATABASE_URL, or, with -private, on a PostgreSQL server of its own
// (initdb in a temporary directory, autovacuum on at its defaults): the shared
// server is never reconfigured.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/internal/cliflags"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/privatepg"
	"github.com/pepsi-pipeline/pepsi/queueadmin"
	"github.com/pepsi-pipeline/pepsi/stage"
	"github.com/pepsi-pipeline/pepsi/store"
	"github.com/pepsi-pipeline/pepsi/tools/internal/dispatchproc"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		stage.Main(map[string]stage.Handler{
			"a": func(context.Context, *stage.Message) stage.Result { return stage.Advance("b") },
			"b": func(context.Context, *stage.Message) stage.Result { return stage.Advance("c") },
			"c": func(context.Context, *stage.Message) stage.Result { return stage.Done() },
		})
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	var bad usageError
	if errors.As(err, &bad) {
		os.Exit(cliflags.Fail(os.Stderr, "pepsi-soak", bad.err))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pepsi-soak:", err)
		os.Exit(1)
	}
}

// usageError is a mistake on the command line (or -h): exit 2 (0), not 1.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }

type soak struct {
	out         io.Writer
	server      string
	dbName      string
	duration    time.Duration
	rate        int
	maxMessages int
	parallelism int
	queueLimit  int
	private     bool
	dispatch    string
	self        string
	retain      time.Duration
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("pepsi-soak", flag.ContinueOnError)
	s := &soak{out: out}
	s.server = os.Getenv("PEPSI_TEST_DATABASE_URL")
	if s.server == "" {
		s.server = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	fs.DurationVar(&s.duration, "duration", 30*time.Minute, "how long the offered load runs")
	fs.IntVar(&s.rate, "rate", 0, "messages offered per second (0: 70% of a measured drain)")
	fs.IntVar(&s.maxMessages, "max-messages", 50, "MAX_MESSAGES of each stage (workers recycle)")
	fs.IntVar(&s.parallelism, "parallelism", 2, "PARALLELISM of each stage")
	fs.IntVar(&s.queueLimit, "queue-limit", 16, "QUEUE_LIMIT of each stage")
	fs.StringVar(&s.dbName, "db-name", "pepsi_soak", "the database it creates afresh (and drops at the end)")
	fs.BoolVar(&s.private, "private", false, "run on a PostgreSQL server of its own, autovacuum on at its defaults")
	fs.StringVar(&s.dispatch, "dispatch", "", "pepsi-dispatch binary (default: next to pepsi-soak, else on PATH)")
	fs.DurationVar(&s.retain, "retain", 5*time.Minute, "purge finished messages older than this every minute, as pepsi-queue purge from cron would (0: keep them)")
	if _, err := cliflags.Parse(fs, args, ""); err != nil {
		return usageError{err}
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find myself: %w", err)
	}
	s.self = self
	if s.dispatch, err = dispatchproc.Find(s.dispatch); err != nil {
		return err
	}
	if s.private {
		pg, err := privatepg.Start()
		if err != nil {
			return fmt.Errorf("private PostgreSQL: %w", err)
		}
		defer pg.Stop() //nolint:errcheck // best effort at exit
		s.server = pg.URL()
	}
	dbURL, drop, err := s.database(ctx)
	if err != nil {
		return err
	}
	defer drop()
	return s.soak(ctx, dbURL)
}

// database creates s.dbName afresh, migrated, and returns its URL.
func (s *soak) database(ctx context.Context) (string, func(), error) {
	admin, err := pgx.Connect(ctx, s.server)
	if err != nil {
		return "", nil, fmt.Errorf("connect to %s: %w", s.server, err)
	}
	defer admin.Close(context.Background())
	ident := pgx.Identifier{s.dbName}.Sanitize()
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
		return "", nil, fmt.Errorf("drop %s: %w", s.dbName, err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return "", nil, fmt.Errorf("create %s: %w", s.dbName, err)
	}
	u, err := url.Parse(s.server)
	if err != nil {
		return "", nil, fmt.Errorf("server URL: %w", err)
	}
	u.Path = "/" + s.dbName
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		return "", nil, err
	}
	defer conn.Close(context.Background())
	if _, err := store.Migrate(ctx, conn); err != nil {
		return "", nil, err
	}
	drop := func() {
		c, err := pgx.Connect(context.Background(), s.server)
		if err == nil {
			_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)") // best effort at exit
			c.Close(context.Background())
		}
	}
	return u.String(), drop, nil
}

// sample is one minute of the run.
type sample struct {
	minute                 int
	done, pending          int64
	dead                   int64
	table, indexes         int64
	rss, fds, threads, gor int64
}

func (s *soak) soak(ctx context.Context, dbURL string) error {
	dir, err := os.MkdirTemp("", "pepsi-soak-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	confFile, err := s.writeConfig(dir, dbURL)
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	d, metricsAddr, err := s.startDispatch(dir, confFile)
	if err != nil {
		return err
	}
	defer d.Stop(stopWait) //nolint:errcheck // at exit, whatever the run's outcome; its log stays in dir until then

	if s.rate == 0 {
		if err := s.calibrate(ctx, conn); err != nil {
			return err
		}
	}
	fmt.Fprintf(s.out, "soak: %d messages/s for %s through 3 stages, MAX_MESSAGES=%d, PARALLELISM=%d, QUEUE_LIMIT=%d, autovacuum %s, finished messages kept %s\n",
		s.rate, s.duration, s.maxMessages, s.parallelism, s.queueLimit, setting(ctx, conn, "autovacuum"), s.retain)
	fmt.Fprintf(s.out, "%6s %10s %9s %11s %9s %9s %8s %5s %7s %10s\n",
		"minute", "done/min", "backlog", "dead tuples", "table MB", "index MB", "RSS MB", "FDs", "threads", "goroutines")

	prodCtx, stopProducer := context.WithCancel(ctx)
	produced := make(chan error, 1)
	go func() { produced <- s.produce(prodCtx, dbURL) }()
	defer stopProducer()

	var samples []sample
	left0 := messagesLeft(ctx, conn)
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	end := time.After(s.duration)
	for minute := 1; ; minute++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-produced:
			return fmt.Errorf("producer: %w", err)
		case <-end:
			stopProducer()
			return s.report(samples)
		case <-tick.C:
		}
		if s.retain > 0 {
			if _, err := queueadmin.Purge(ctx, conn, s.retain, 10000, nil, nil); err != nil {
				return fmt.Errorf("purge: %w", err)
			}
		}
		left := messagesLeft(ctx, conn)
		sm := takeSample(ctx, conn, minute, left-left0, d.Pid(), metricsAddr)
		left0 = left
		samples = append(samples, sm)
		fmt.Fprintf(s.out, "%6d %10d %9d %11d %9.1f %9.1f %8.1f %5d %7d %10d\n", sm.minute, sm.done, sm.pending, sm.dead,
			float64(sm.table)/(1<<20), float64(sm.indexes)/(1<<20), float64(sm.rss)/1024, sm.fds, sm.threads, sm.gor)
	}
}

// writeConfig writes the soak's pepsi.conf into dir: three stages a, b and c,
// each run by this program, and returns its name.
func (s *soak) writeConfig(dir, dbURL string) (string, error) {
	file := filepath.Join(dir, "pepsi.conf")
	text := fmt.Sprintf("[pepsi]\nDATABASE = %s\n[pepsi-dispatch]\nSTATS_INTERVAL = 5\n", dbURL)
	for _, st := range []string{"a", "b", "c"} {
		text += fmt.Sprintf("[stage-%s]\nPROGRAM = %s\nPARALLELISM = %d\nQUEUE_LIMIT = %d\nMAX_MESSAGES = %d\n",
			st, s.self, s.parallelism, s.queueLimit, s.maxMessages)
	}
	return file, os.WriteFile(file, []byte(text), 0o644)
}

// stopWait is how long pepsi-dispatch may take to exit after SIGTERM.
const stopWait = 30 * time.Second

// startDispatch starts pepsi-dispatch on confFile, logging JSON to
// dir/dispatch.log, with its metrics on a free address.
func (s *soak) startDispatch(dir, confFile string) (*dispatchproc.Process, string, error) {
	metricsAddr, err := freeAddr()
	if err != nil {
		return nil, "", err
	}
	d, err := dispatchproc.Start(dispatchproc.Config{Binary: s.dispatch, Conf: confFile,
		Args: []string{"-metrics-addr", metricsAddr, "-log-format", "json"}, Log: filepath.Join(dir, "dispatch.log")})
	return d, metricsAddr, err
}

// calibrate sets s.rate to 70% of what the pipeline finishes in 20 s of a
// 100,000-message backlog, and then drops what is left of the backlog.
func (s *soak) calibrate(ctx context.Context, conn *pgx.Conn) error {
	n := 100000
	if _, err := conn.Exec(ctx, `INSERT INTO pepsi.queue (stage) SELECT 'a' FROM generate_series(1, $1::int)`, n); err != nil {
		return err
	}
	began := time.Now()
	for time.Since(began) < 20*time.Second {
		time.Sleep(time.Second)
	}
	var done int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pepsi.queue WHERE status = 'done'`).Scan(&done); err != nil {
		return err
	}
	s.rate = max(1, int(float64(done)/time.Since(began).Seconds()*0.7))
	fmt.Fprintf(s.out, "calibration: %d messages done in 20 s; offering 70%%: %d messages/s\n", done, s.rate)
	if _, err := conn.Exec(ctx, `DELETE FROM pepsi.queue WHERE status = 'pending'`); err != nil {
		return err
	}
	return nil
}

// takeSample reads one minute's sample: the queue's backlog and size from
// conn, the dispatcher's (pid's) memory, descriptors and threads from /proc,
// its goroutines from its metrics on metricsAddr. A figure it cannot read
// stays 0.
func takeSample(ctx context.Context, conn *pgx.Conn, minute int, done int64, pid int, metricsAddr string) sample {
	sm := sample{minute: minute, done: done}
	_ = conn.QueryRow(ctx, `SELECT count(*) FROM pepsi.queue WHERE status = 'pending'`).Scan(&sm.pending)
	_ = conn.QueryRow(ctx, `SELECT coalesce(n_dead_tup, 0), pg_relation_size('pepsi.queue'), pg_indexes_size('pepsi.queue')
		FROM pg_stat_user_tables WHERE relid = 'pepsi.queue'::regclass`).Scan(&sm.dead, &sm.table, &sm.indexes)
	sm.rss, sm.threads = procStatus(pid)
	sm.fds = countFDs(pid)
	sm.gor = goroutines(metricsAddr)
	return sm
}

// produce inserts s.rate messages a second, in batches every 100 ms, one
// transaction each (the trigger notifies the dispatcher).
func (s *soak) produce(ctx context.Context, dbURL string) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	owed := 0.0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		owed += float64(s.rate) / 10
		n := int(owed)
		owed -= float64(n)
		if n == 0 {
			continue
		}
		if _, err := conn.Exec(ctx, `INSERT INTO pepsi.queue (stage) SELECT 'a' FROM generate_series(1, $1::int)`, n); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// report prints the first and last five minutes and the slopes that say whether
// the run stayed flat.
func (s *soak) report(samples []sample) error {
	if len(samples) < 10 {
		fmt.Fprintf(s.out, "soak: %d minutes measured; 10 or more are needed for the first/last 5-minute comparison\n", len(samples))
		return nil
	}
	avg := func(xs []sample, f func(sample) float64) float64 {
		t := 0.0
		for _, x := range xs {
			t += f(x)
		}
		return t / float64(len(xs))
	}
	first, last := samples[:5], samples[len(samples)-5:]
	done := func(x sample) float64 { return float64(x.done) }
	a, b := avg(first, done), avg(last, done)
	fmt.Fprintf(s.out, "throughput: first 5 minutes %.0f/min, last 5 minutes %.0f/min: last/first = %.3f (target within 10%%)\n", a, b, b/a)
	for _, m := range []struct {
		name string
		f    func(sample) float64
	}{
		{"RSS MB", func(x sample) float64 { return float64(x.rss) / 1024 }},
		{"FDs", func(x sample) float64 { return float64(x.fds) }},
		{"goroutines", func(x sample) float64 { return float64(x.gor) }},
		{"table MB", func(x sample) float64 { return float64(x.table) / (1 << 20) }},
		{"index MB", func(x sample) float64 { return float64(x.indexes) / (1 << 20) }},
	} {
		fmt.Fprintf(s.out, "%-10s first 5 min %.1f, last 5 min %.1f, slope over the run %+.3f per minute\n",
			m.name, avg(first, m.f), avg(last, m.f), slope(samples, m.f))
	}
	return nil
}

// slope is the least-squares slope of f over the samples, per minute.
func slope(xs []sample, f func(sample) float64) float64 {
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for _, x := range xs {
		t, y := float64(x.minute), f(x)
		sx, sy, sxx, sxy = sx+t, sy+y, sxx+t*t, sxy+t*y
	}
	if d := n*sxx - sx*sx; d != 0 {
		return (n*sxy - sx*sy) / d
	}
	return 0
}

func messagesLeft(ctx context.Context, conn *pgx.Conn) int64 {
	var n int64
	_ = conn.QueryRow(ctx, `SELECT messages_left FROM pepsi.dispatch_stats`).Scan(&n)
	return n
}

func setting(ctx context.Context, conn *pgx.Conn, name string) string {
	var v string
	if err := conn.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&v); err != nil {
		return "unknown"
	}
	return v
}

// procStatus reads VmRSS (kB) and Threads of a process.
func procStatus(pid int) (rssKB, threads int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			rssKB, _ = strconv.ParseInt(f[1], 10, 64)
		case "Threads:":
			threads, _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	return rssKB, threads
}

func countFDs(pid int) int64 {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0
	}
	return int64(len(ents))
}

// goroutines reads go_goroutines from the dispatcher's -metrics-addr.
func goroutines(addr string) int64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "go_goroutines "); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return int64(n)
		}
	}
	return 0
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
