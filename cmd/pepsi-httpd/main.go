// Command pepsi-httpd serves a PEPSI pipeline's state over HTTP: Prometheus
// metrics at /metrics, a live page for operators at /, its data at /api/status
// and a health check at /healthz. Its queries and handlers live in httpd;
// this file parses flags, connects and serves. It never shows a message's
// payload, and never writes to the database but for the page's actions
// (ACTIONS = on in [pepsi-httpd]), which are queueadmin's. See
// docs/pepsi-httpd.8.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/httpd"
	"github.com/pepsi-pipeline/pepsi/internal/bearer"
	"github.com/pepsi-pipeline/pepsi/internal/cliflags"
	"github.com/pepsi-pipeline/pepsi/internal/logflags"
	"github.com/pepsi-pipeline/pepsi/queueadmin"
)

const usage = `pepsi-httpd: serve a PEPSI pipeline's state over HTTP.

Usage: pepsi-httpd [flags]

  /metrics      Prometheus metrics: queue depths, the dispatcher's statistics
  /             a live status page for operators
  /api/status   the page's data, as JSON
  /healthz      200 if the database answers, 503 if not

It only reads the database (a read-only role is enough: see pepsi-httpd(8)) and
never shows payloads. It listens on 127.0.0.1 unless -listen says otherwise.
With ACTIONS = on and TOKENS_FILE in [pepsi-httpd] of the -c file, the page
offers retry and discard to operators who sign in with a token.

Every flag can also be set as a PEPSI_* environment variable (-listen as
PEPSI_LISTEN, -database as PEPSI_DATABASE). The database is -database, else
[pepsi] DATABASE of the -c file, else the libpq PG* environment.

Exit status: 0 stopped by SIGINT or SIGTERM; 1 the database has no PEPSI schema
or the listening address is unusable at start (a database that is down is
served as down until it comes); 2 bad flags or configuration.

Flags:
`

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// shutdownGrace is how long requests in flight may finish after a signal.
const shutdownGrace = 5 * time.Second

func main() {
	// SIGHUP re-reads TOKENS_FILE, as pepsi-ingress re-reads its tokens;
	// without a handler it ended the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	cliflags.Main(func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
		return run(ctx, args, stdout, stderr, hup, nil)
	})
}

// run is the whole program; it returns the exit code. The help and the
// version, asked for, go to stdout; everything else to stderr. hup delivers
// SIGHUP; ready, if not nil, is called with the address once the server
// listens.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, hup <-chan os.Signal, ready func(addr string)) int {
	fs := cliflags.NewFlagSet("pepsi-httpd", usage, stdout)
	var (
		configFile  = fs.String("c", "", "pepsi.conf `FILE` (for [pepsi] DATABASE and the stage names)")
		database    = fs.String("database", "", "PostgreSQL `URL` or key=value string; overrides [pepsi] DATABASE")
		listen      = fs.String("listen", "127.0.0.1:9650", "`ADDRESS` to serve on (host:port)")
		stmtTimeout = fs.Duration("statement-timeout", httpd.StatementTimeoutDefault, "the longest a statement of one read may run on the server")
		cacheAge    = fs.Duration("cache", httpd.CacheMaxAgeDefault, "scrapes and page polls within this `DURATION` share one database read")
		sample      = fs.Duration("sample-interval", httpd.SampleIntervalDefault, "how often the page's charts take a sample")
		history     = fs.Int("history", httpd.HistoryMaxDefault, "how many samples the charts keep")
		hosts       = fs.String("hosts", "", "comma-separated host `NAMES` the page answers to besides IP addresses, localhost and this machine's name (* for any)")
		logFormat   = fs.String("log-format", "text", "log format: text or json")
		logLevel    = fs.String("log-level", "info", "log level: debug, info, warn or error")
	)
	// A mistake on the command line is one line and a pointer to -h, as in
	// every PEPSI program; one in the configuration or the database's
	// connection string is one line.
	parsed, err := cliflags.Parse(fs, args, "PEPSI")
	if err != nil {
		return cliflags.Fail(stderr, "pepsi-httpd", err) // 0 after -h and -version
	}
	badFlag := func(format string, a ...any) int {
		return cliflags.Fail(stderr, "pepsi-httpd", fmt.Errorf(format, a...))
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "pepsi-httpd: "+format+"\n", a...)
		return exitUsage
	}
	outOfRange := parsed.OutOfRange(fs, 1, "statement-timeout", "cache", "sample-interval")
	switch {
	case fs.NArg() > 0:
		return badFlag("unexpected arguments %q", fs.Args())
	case outOfRange != "":
		return badFlag("%s", outOfRange)
	case *history <= 0 || *history > 100_000:
		return badFlag("%s %d: want 1 to 100000", parsed.Name("history"), *history)
	}
	if _, _, err := net.SplitHostPort(*listen); err != nil {
		return badFlag("%s %q: %w", parsed.Name("listen"), *listen, err)
	}
	log, err := logflags.New(stderr, *logFormat, *logLevel, parsed.Name)
	if err != nil {
		return badFlag("%w", err)
	}
	cfg := &conf.Config{}
	if *configFile != "" {
		if cfg, err = readConfig(*configFile); err != nil {
			return bad("configuration: %v", err)
		}
	}
	var stages []string
	for _, s := range cfg.Stages {
		stages = append(stages, s.Name)
	}
	db, dbFrom := parsed.Database(log, *database, *configFile, cfg.Database)
	if _, err := pgx.ParseConfig(db); err != nil {
		return bad("database connection string: %v", err)
	}
	var acts *httpd.Actions
	if cfg.Httpd.Actions {
		tokens, err := bearer.LoadTokens(cfg.Httpd.TokensFile)
		if err != nil {
			return bad("[pepsi-httpd] TOKENS_FILE: %v", err)
		}
		acts = httpd.NewActions(tokens, queueadmin.PageActions{Database: db}, log)
	}
	return serve(ctx, httpd.Options{
		Database: db, Stages: stages, StatementTimeout: *stmtTimeout, CacheMaxAge: *cacheAge,
		SampleInterval: *sample, HistoryMax: *history, Log: log, Hosts: hostNames(*hosts),
	}, acts, *listen, dbFrom, stderr, hup, ready)
}

// hostNames are the names the page answers to (httpd.Options.Hosts): those
// of -hosts, and this machine's own name, by which a browser on the machine
// or a proxy in front that passes its Host on may reach it.
func hostNames(flag string) []string {
	var names []string
	if h, err := os.Hostname(); err == nil && h != "" {
		names = append(names, h)
	}
	for _, n := range strings.Split(flag, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	return names
}

// readConfig reads the configuration file.
func readConfig(file string) (*conf.Config, error) {
	text, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	return conf.Parse(file, string(text))
}

// serve serves o's database on listen until ctx ends (then it lets requests
// in flight finish for shutdownGrace), and returns the exit code. ready, if not
// nil, is called with the address once the server listens.
// dbFrom says where o.Database came from, for the start-up line.
func serve(ctx context.Context, o httpd.Options, acts *httpd.Actions, listen, dbFrom string, stderr io.Writer, hup <-chan os.Signal, ready func(addr string)) int {
	log := o.Log
	src, err := httpd.Open(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "pepsi-httpd: %s\n", oneLine(err))
		return exitFailure
	}
	defer src.Close()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		fmt.Fprintf(stderr, "pepsi-httpd: %v\n", err)
		return exitFailure
	}
	srv := httpd.NewServer(listen, src, acts)
	srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	sampleCtx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	go src.Sample(sampleCtx)

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("pepsi-httpd serving", "addr", "http://"+ln.Addr().String()+"/",
		"database", cliflags.Redact(o.Database), "database_from", dbFrom, "actions", acts != nil)
	if ready != nil {
		ready(ln.Addr().String())
	}
	if err := waitServing(ctx, log, served, hup, acts); err != nil {
		log.Error("pepsi-httpd stopped", "err", err)
		return exitFailure
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("requests cut off at shutdown", "err", err)
	}
	log.Info("pepsi-httpd stopped")
	return exitOK
}

// oneLine puts err on one line: pgx lists each address it tried on a line of
// its own.
func oneLine(err error) string {
	return strings.NewReplacer(":\n\t", ": ", "\n\t", "; ", "\n", " ").Replace(err.Error())
}

// waitServing waits until ctx ends (nil) or the server fails (its error),
// re-reading TOKENS_FILE on each SIGHUP: a file that fails to load leaves
// the tokens in use as they were.
func waitServing(ctx context.Context, log *slog.Logger, served <-chan error, hup <-chan os.Signal, acts *httpd.Actions) error {
	for {
		select {
		case err := <-served:
			return err
		case <-ctx.Done():
			return nil
		case <-hup:
			if acts == nil {
				log.Info("SIGHUP: nothing to reload (ACTIONS is off)")
				continue
			}
			if n, err := acts.Reload(); err != nil {
				log.Error("SIGHUP: tokens not reloaded; the old ones stay in use", "err", err)
			} else {
				log.Info("SIGHUP: tokens reloaded", "tokens", n)
			}
		}
	}
}
