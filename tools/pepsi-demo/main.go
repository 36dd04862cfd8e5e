// Command pepsi-demo runs the example pipeline end to end on a real PostgreSQL:
// it (re)creates its own database, applies the schema with pepsi-queue, starts
// pepsi-dispatch on testdata/demo.conf, enqueues messages whose fate is decided by
// their payload (package pipeline), shows live progress, stops the dispatcher with
// SIGTERM, prints a summary and checks that every message ended exactly where the
// pipeline's rules say. It exits 0 only if it did. "make demo" builds the programs (make build)
// into bin/ and runs it with bin/ on PATH.
//
// It never touches a database other than its own (-db-name, dropped and created
// afresh), and it leaves that database behind for inspection.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/examples/pepsi-example/pipeline"
	"github.com/pepsi-pipeline/pepsi/internal/cliflags"
	"github.com/pepsi-pipeline/pepsi/queueadmin"
	"github.com/pepsi-pipeline/pepsi/tools/internal/dispatchproc"
)

func main() {
	cliflags.Main(run)
}

// defaultServer is the PostgreSQL the demo uses when PEPSI_DATABASE is not set.
const defaultServer = "postgres://postgres@127.0.0.1:5432/postgres"

// Bounds of the demo's waits.
const (
	// stopWait is how long pepsi-dispatch may take to exit after SIGTERM.
	stopWait = 30 * time.Second
	// pollTTY and pollPlain are how often progress is read and shown.
	pollTTY   = 200 * time.Millisecond
	pollPlain = 2 * time.Second
)

// demo holds one run's settings and what it has set up.
type demo struct {
	n        int
	server   string // admin URL of the server
	dbName   string
	testdata string
	timeout  time.Duration
	out      io.Writer
	tty      bool

	url    string   // the demo database
	dir    string   // temporary files: configuration, dispatcher log
	conf   string   // the configuration file
	logf   string   // the dispatcher's log file
	env    []string // environment of the programs the demo starts
	failed bool     // a check failed
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pepsi-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	d := &demo{out: stdout}
	fs.IntVar(&d.n, "n", 10000, "how many messages to enqueue")
	fs.StringVar(&d.server, "database", defaultServer, "admin `URL` of the PostgreSQL server; the demo creates its own database there (env PEPSI_DATABASE)")
	fs.StringVar(&d.dbName, "db-name", "pepsi_demo", "`NAME` of the demo's database, dropped and created afresh")
	fs.StringVar(&d.testdata, "testdata", "", "the repository's testdata `DIR` (default: next to the binary's bin/, or above the working directory)")
	fs.DurationVar(&d.timeout, "timeout", 5*time.Minute, "how long the pipeline may take to finish every message")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: pepsi-demo [flags]\n\nRuns the example pipeline end to end on PostgreSQL and checks the result.\n\n")
		fs.PrintDefaults()
	}
	if _, err := cliflags.Parse(fs, args, "PEPSI"); err != nil {
		return cliflags.Fail(stderr, "pepsi-demo", err)
	}
	if fs.NArg() > 0 || d.n <= 0 || !regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`).MatchString(d.dbName) {
		fmt.Fprintf(stderr, "pepsi-demo: want no arguments, -n > 0 and a -db-name of lower-case letters, digits and '_'\n")
		return 2
	}
	if f, ok := stdout.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			d.tty = true
		}
	}
	err := d.run(ctx)
	if d.dir != "" {
		// Kept, pass or fail: reading the dispatcher's log is part of the demo.
		fmt.Fprintf(stdout, "\nThe configuration and pepsi-dispatch's log are in %s (delete it when done)\n", d.dir)
	}
	if err != nil {
		fmt.Fprintf(stderr, "pepsi-demo: %v\n", err)
		return 1
	}
	if d.failed {
		fmt.Fprintf(stdout, "\nFAIL: some messages did not end where the pipeline's rules say (see above).\n")
		return 1
	}
	fmt.Fprintf(stdout, "\nPASS: every message ended where the pipeline's rules say.\n")
	return 0
}

func (d *demo) step(format string, args ...any) {
	fmt.Fprintf(d.out, "\n==> "+format+"\n", args...)
}

func (d *demo) run(ctx context.Context) error {
	if err := d.prepare(ctx); err != nil {
		return err
	}

	d.step("Applying the schema")
	if err := d.tool(ctx, nil, "migrate"); err != nil {
		return err
	}

	d.step("Starting pepsi-dispatch (log: %s)", d.logf)
	dispatcher, err := d.startDispatcher()
	if err != nil {
		return err
	}
	stopped := false
	defer func() {
		if !stopped { // an early return: do not leave the dispatcher running
			dispatcher.Kill()
			d.showLog()
		}
	}()

	d.step("Enqueueing %d messages at stage parse", d.n)
	var input bytes.Buffer
	payloads := make([][]byte, d.n)
	for i := range payloads {
		payloads[i] = pipeline.Payload(i + 1)
		input.Write(payloads[i])
		input.WriteByte('\n')
	}
	want := pipeline.Expect(payloads)
	start := time.Now()
	if err := d.tool(ctx, &input, "enqueue", "-stage", pipeline.Parse); err != nil {
		return err
	}

	d.step("Waiting for every message to leave the pipeline")
	conn, err := queueadmin.Connect(ctx, d.url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := d.watch(ctx, conn, dispatcher); err != nil {
		return err
	}
	elapsed := time.Since(start)

	d.step("Stopping pepsi-dispatch with SIGTERM")
	stopped = true
	code, err := dispatcher.Stop(stopWait)
	if err != nil {
		d.showLog()
		return err
	}
	d.check(code == 0, "pepsi-dispatch exited with status %d after SIGTERM (want 0)", code)

	d.step("Summary")
	if err := d.summary(ctx, conn, elapsed); err != nil {
		return err
	}
	d.step("Checks against the pipeline's rules")
	if err := d.checks(ctx, conn, want); err != nil {
		return err
	}
	if d.failed {
		d.showLog()
	}
	fmt.Fprintf(d.out, "\nThe database %s stays for inspection, e.g.:\n  pepsi-queue -database '%s' stats\n  pepsi-queue -database '%s' show 1\n",
		d.dbName, redact(d.url), redact(d.url))
	return nil
}

// prepare finds the files and programs, creates the database and writes the
// configuration.
func (d *demo) prepare(ctx context.Context) error {
	if d.testdata == "" {
		d.testdata = findTestdata()
	}
	template, err := os.ReadFile(filepath.Join(d.testdata, "demo.conf"))
	if err != nil {
		return fmt.Errorf("the demo configuration template: %w (use -testdata DIR)", err)
	}
	stages, err := filepath.Abs(filepath.Join(d.testdata, "stages"))
	if err != nil {
		return err
	}
	for _, prog := range []string{"pepsi-dispatch", "pepsi-queue", "pepsi-example"} {
		if _, err := exec.LookPath(prog); err != nil {
			return fmt.Errorf("%s is not on PATH: run \"make demo\", which builds the programs into bin/ and puts bin/ on PATH (%v)", prog, err)
		}
	}

	u, err := url.Parse(d.server)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return fmt.Errorf("-database / PEPSI_DATABASE %q: the demo needs a postgres:// URL of the server", d.server)
	}
	u.Path = "/" + d.dbName
	d.url = u.String()
	fmt.Fprintf(d.out, "==> Creating database %s on %s\n", d.dbName, u.Host)
	admin, err := queueadmin.Connect(ctx, d.server)
	if err != nil {
		return err
	}
	defer admin.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", d.dbName).Scan(&exists); err != nil {
		return fmt.Errorf("look for database %s: %w", d.dbName, err)
	}
	if exists {
		// Never drop a database without a word: it may be an earlier demo's
		// that someone is still looking at (-db-name chooses another).
		fmt.Fprintf(d.out, "    database %s already exists (an earlier demo's?): dropping it and everything in it\n", d.dbName)
	}
	for _, sql := range []string{"DROP DATABASE IF EXISTS " + d.dbName + " WITH (FORCE)", "CREATE DATABASE " + d.dbName} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}

	if d.dir, err = os.MkdirTemp("", "pepsi-demo-"); err != nil {
		return err
	}
	text := strings.NewReplacer("@DATABASE@", d.url, "@STAGES@", stages).Replace(string(template))
	d.conf = filepath.Join(d.dir, "demo.conf")
	d.logf = filepath.Join(d.dir, "pepsi-dispatch.log")
	if _, err := conf.Parse(d.conf, text); err != nil {
		return fmt.Errorf("the demo configuration: %w", err)
	}
	if err := os.WriteFile(d.conf, []byte(text), 0o600); err != nil {
		return err
	}
	// The programs read their database from the configuration: a PEPSI_*
	// variable of ours (PEPSI_DATABASE names the server, not the demo database)
	// must not override it.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PEPSI_") {
			d.env = append(d.env, kv)
		}
	}
	return nil
}

// findTestdata looks for testdata/demo.conf next to the binary's directory
// (bin/../testdata) and then in the working directory and its parents.
func findTestdata() string {
	var candidates []string
	if exe, err := os.Executable(); err == nil {
		candidates = append(candidates, filepath.Join(filepath.Dir(filepath.Dir(exe)), "testdata"))
	}
	if wd, err := os.Getwd(); err == nil {
		for dir := wd; ; dir = filepath.Dir(dir) {
			candidates = append(candidates, filepath.Join(dir, "testdata"))
			if filepath.Dir(dir) == dir {
				break
			}
		}
	}
	for _, c := range candidates {
		if _, err := os.Stat(filepath.Join(c, "demo.conf")); err == nil {
			return c
		}
	}
	return "testdata"
}

// tool runs pepsi-queue -c CONF args, showing the command and its output.
func (d *demo) tool(ctx context.Context, stdin io.Reader, args ...string) error {
	full := append([]string{"-c", d.conf}, args...)
	fmt.Fprintf(d.out, "$ pepsi-queue %s\n", strings.Join(full, " "))
	cmd := exec.CommandContext(ctx, "pepsi-queue", full...)
	cmd.Env = d.env
	cmd.Stdin = stdin
	out, err := cmd.CombinedOutput()
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		fmt.Fprintf(d.out, "  %s\n", line)
	}
	if err != nil {
		return fmt.Errorf("pepsi-queue %s: %w", args[0], err)
	}
	return nil
}

// startDispatcher starts pepsi-dispatch (from PATH, as the demo shows it) on
// the demo's configuration, its log in d.logf.
func (d *demo) startDispatcher() (*dispatchproc.Process, error) {
	fmt.Fprintf(d.out, "$ pepsi-dispatch -c %s 2>%s &\n", d.conf, d.logf)
	return dispatchproc.Start(dispatchproc.Config{Binary: dispatchproc.Name, Conf: d.conf, Log: d.logf})
}

// watch shows progress until every message has left the pipeline.
func (d *demo) watch(ctx context.Context, conn *pgx.Conn, dispatcher *dispatchproc.Process) error {
	every := pollPlain
	if d.tty {
		every = pollTTY
	}
	p := newProgress(d.out, d.n, d.tty)
	defer p.finish()
	deadline := time.After(d.timeout)
	tick := time.NewTicker(every)
	defer tick.Stop()
	start := time.Now()
	for {
		s, err := queueadmin.ReadStats(ctx, conn)
		if err != nil {
			return err
		}
		finished := s.Count("done") + s.Count("failed") + s.Count("timeout")
		p.show(s, finished, time.Since(start))
		if finished >= int64(d.n) {
			return nil
		}
		select {
		case <-tick.C:
		case <-dispatcher.Done():
			return fmt.Errorf("pepsi-dispatch exited (status %d) before the pipeline finished; see its log above", dispatcher.ExitCode())
		case <-deadline:
			return fmt.Errorf("the pipeline did not finish %d messages within %v (-timeout); %d finished", d.n, d.timeout, finished)
		case <-ctx.Done():
			return fmt.Errorf("interrupted: %w", ctx.Err())
		}
	}
}

// showLog prints the end of the dispatcher's log.
func (d *demo) showLog() {
	text, err := os.ReadFile(d.logf)
	if err != nil || len(text) == 0 {
		return
	}
	lines := strings.Split(strings.TrimRight(string(text), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	fmt.Fprintf(d.out, "\n--- the last %d lines of pepsi-dispatch's log ---\n%s\n---\n", len(lines), strings.Join(lines, "\n"))
}

// check reports one expectation and remembers a failure.
func (d *demo) check(ok bool, format string, args ...any) {
	mark := "ok  "
	if !ok {
		mark = "FAIL"
		d.failed = true
	}
	fmt.Fprintf(d.out, "%s %s\n", mark, fmt.Sprintf(format, args...))
}

func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return s
	}
	return u.Redacted()
}
