// Command pepsi-ingress is the front door of a PEPSI pipeline over HTTP: it
// takes messages at POST /v1/messages from producers that have no database
// access and commits them to pepsi.queue, answering 202 with their ids once
// committed. Its handlers, group commit and SQL live in ingress; this
// file parses flags and the configuration, connects, serves, reloads tokens
// and certificates on SIGHUP and shuts down cleanly on SIGTERM. See
// docs/pepsi-ingress.8.md.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/ingress"
	"github.com/pepsi-pipeline/pepsi/internal/bearer"
	"github.com/pepsi-pipeline/pepsi/internal/cliflags"
	"github.com/pepsi-pipeline/pepsi/internal/logflags"
	"github.com/pepsi-pipeline/pepsi/internal/pgaddr"
	"github.com/pepsi-pipeline/pepsi/internal/tracing"
	"github.com/pepsi-pipeline/pepsi/store"
)

const usage = `pepsi-ingress: take messages over HTTP and commit them to a PEPSI queue.

Usage: pepsi-ingress [flags]

  POST /v1/messages   one JSON object (application/json) or one per line
                      (application/x-ndjson): {"stage", "payload" |
                      "payload_base64", "state", "key", "order_key",
                      "traceparent"} (else the traceparent header);
                      202 {"ids":[...]} once committed
  GET /healthz        200 if the database answers, 503 if not
  GET /metrics        Prometheus metrics

[pepsi-ingress] in the -c file sets LISTEN, TOKENS_FILE, TLS_CERT, TLS_KEY,
MAX_BODY and MAX_PENDING (pepsi.conf(5)); -listen overrides LISTEN. It
listens on 127.0.0.1:8180 unless told otherwise, and refuses to listen
elsewhere without TOKENS_FILE. SIGHUP re-reads the tokens and the certificate;
SIGTERM or SIGINT stops accepting, finishes what it accepted, and exits 0.

Every flag can also be set as a PEPSI_* environment variable (-listen as
PEPSI_LISTEN). The database is -database, else [pepsi] DATABASE of the -c file,
else the libpq PG* environment.

Exit status: 0 stopped by SIGTERM or SIGINT; 1 the database, the listening
address, the tokens or the certificate are unusable at start, or requests were
cut off at shutdown; 2 bad flags or configuration.

Flags:
`

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// schemaNeeded is the schema version with pepsi.queue.dedup_key.
const schemaNeeded = 8

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, hup, nil)
	stop()
	os.Exit(code)
}

// config is what run works out from the flags and the file.
type config struct {
	ingress    conf.Ingress
	database   string
	dbFrom     string // where database came from, for the start-up line
	stages     []string
	o          ingress.Options
	timeouts   ingress.Timeouts
	grace      time.Duration
	configFile string
}

// run is the whole program; it returns the exit code. The help and the
// version, asked for, go to stdout; everything else to stderr. hup delivers SIGHUP;
// ready, if not nil, is called with the address once the server listens.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, hup <-chan os.Signal, ready func(addr string)) int {
	fs := cliflags.NewFlagSet("pepsi-ingress", usage, stdout)
	var (
		configFile  = fs.String("c", "/etc/pepsi/pepsi.conf", "pepsi.conf `FILE`: the database, the stages and [pepsi-ingress]")
		database    = fs.String("database", "", "PostgreSQL `URL` or key=value string; overrides [pepsi] DATABASE")
		listen      = fs.String("listen", "", "`ADDRESS` (host:port) to listen on; overrides LISTEN")
		batchMax    = fs.Int("batch-max", ingress.BatchMaxDefault, "the most messages of one transaction (group commit)")
		batchWait   = fs.Duration("batch-wait", ingress.BatchWaitDefault, "the longest a request waits for others to share its transaction")
		batchIdle   = fs.Duration("batch-idle", ingress.BatchIdleDefault, "with no other transaction in flight, a batch commits once no request has arrived for this long (0: at once; -batch-wait or more: it waits the whole -batch-wait)")
		committers  = fs.Int("committers", ingress.CommittersDefault, "transactions in flight at once, each on its own connection")
		lineMax     = fs.Int("max-line", ingress.LineMaxDefault, "the most bytes of one message (an NDJSON line, or a JSON body)")
		msgsMax     = fs.Int("max-messages", ingress.MessagesMaxDefault, "the most messages of one request")
		inFlight    = fs.Int("max-in-flight", ingress.InFlightMaxDefault, "requests handled at once; more get 503")
		pendingEach = fs.Duration("pending-interval", ingress.PendingIntervalDefault, "how often the pending counts behind MAX_PENDING are read")
		readHeader  = fs.Duration("read-header-timeout", ingress.TimeoutsDefault.ReadHeader, "the longest a client may take to send its headers (and, on a new connection, to start)")
		readAll     = fs.Duration("read-timeout", ingress.TimeoutsDefault.Read, "the longest a client may take to send a request's body, from the end of its headers")
		write       = fs.Duration("write-timeout", ingress.TimeoutsDefault.Write, "the longest from a request's headers to the end of its answer")
		idle        = fs.Duration("idle-timeout", ingress.TimeoutsDefault.Idle, "the longest a keep-alive connection may wait for its next request")
		grace       = fs.Duration("shutdown-grace", 30*time.Second, "at SIGTERM, how long requests in flight may take to finish")
		logFormat   = fs.String("log-format", "text", "log format: text or json")
		logLevel    = fs.String("log-level", "info", "log level: debug, info, warn or error")
	)
	// A mistake on the command line is one line and a pointer to -h, as in
	// every PEPSI program; one in the configuration file is one line.
	parsed, err := cliflags.Parse(fs, args, "PEPSI")
	if err != nil {
		return cliflags.Fail(stderr, "pepsi-ingress", err) // 0 after -h and -version
	}
	badFlag := func(format string, a ...any) int {
		return cliflags.Fail(stderr, "pepsi-ingress", fmt.Errorf(format, a...))
	}
	if fs.NArg() > 0 {
		return badFlag("unexpected arguments %q", fs.Args())
	}
	if bad := parsed.OutOfRange(fs, 1, "batch-max", "committers", "max-line", "max-messages", "max-in-flight",
		"pending-interval", "read-header-timeout", "read-timeout", "write-timeout", "idle-timeout", "shutdown-grace"); bad != "" {
		return badFlag("%s", bad)
	}
	if bad := parsed.OutOfRange(fs, 0, "batch-wait", "batch-idle"); bad != "" {
		return badFlag("%s", bad)
	}
	log, err := logflags.New(stderr, *logFormat, *logLevel, parsed.Name)
	if err != nil {
		return badFlag("%w", err)
	}
	cfg, stages, err := readConfig(*configFile)
	if err != nil {
		fmt.Fprintf(stderr, "pepsi-ingress: configuration: %v\n", err)
		return exitUsage
	}
	in := cfg.Ingress
	if *listen != "" {
		if _, _, err := net.SplitHostPort(*listen); err != nil {
			return badFlag("%s %q: %w", parsed.Name("listen"), *listen, err)
		}
		in.Listen = *listen
		if key, err := in.Check(); err != nil {
			return badFlag("%s (%s): %w", parsed.Name("listen"), key, err)
		}
	}
	db, dbFrom := parsed.Database(log, *database, *configFile, cfg.Database)
	c := config{ingress: in, database: db, dbFrom: dbFrom, stages: stages, grace: *grace, configFile: *configFile,
		timeouts: ingress.Timeouts{ReadHeader: *readHeader, Read: *readAll, Write: *write, Idle: *idle},
		o: ingress.Options{Stages: stages, MaxPending: in.MaxPending, StageMaxPending: stageLimits(cfg), PendingInterval: *pendingEach,
			Limits:   ingress.Limits{Body: in.MaxBody, Line: *lineMax, Messages: *msgsMax},
			BatchMax: *batchMax, BatchWait: *batchWait, BatchIdle: *batchIdle, Committers: *committers, InFlightMax: *inFlight, Log: log}}
	return serve(ctx, c, log, stderr, hup, ready)
}

// stageLimits are the stages' own MAX_PENDING, by stage (those that have one).
func stageLimits(cfg *conf.Config) map[string]int64 {
	out := map[string]int64{}
	for _, s := range cfg.Stages {
		if s.MaxPending > 0 {
			out[s.Name] = s.MaxPending
		}
	}
	return out
}

// readConfig reads the configuration file and the names of its stages; a file
// without a stage is refused, as there is no stage to take messages for.
func readConfig(file string) (*conf.Config, []string, error) {
	text, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := conf.Parse(file, string(text))
	if err != nil {
		return nil, nil, err
	}
	var stages []string
	for _, s := range cfg.Stages {
		stages = append(stages, s.Name)
	}
	if len(stages) == 0 {
		return nil, nil, fmt.Errorf("%s has no [stage-NAME] section: there is no stage to take messages for", file)
	}
	return cfg, stages, nil
}

// serve connects, listens and serves until ctx ends, then shuts down.
func serve(ctx context.Context, c config, log *slog.Logger, stderr io.Writer, hup <-chan os.Signal, ready func(addr string)) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "pepsi-ingress: "+format+"\n", a...)
		return exitFailure
	}
	if c.ingress.TokensFile != "" {
		tokens, err := bearer.LoadTokens(c.ingress.TokensFile)
		if err != nil {
			return fail("%v", err)
		}
		c.o.Tokens = tokens
	}
	var cert *certificate
	if c.ingress.TLSCert != "" {
		var err error
		if cert, err = loadCertificate(c.ingress.TLSCert, c.ingress.TLSKey); err != nil {
			return fail("%v", err)
		}
	}
	pool, err := connect(ctx, c.database, c.o.Committers+4)
	if err != nil {
		return fail("%s", oneLine(err))
	}
	defer pool.Close()
	traces, err := tracing.New(ctx, "pepsi-ingress", log)
	if err != nil {
		// A bad OTEL_* setting is the environment's configuration: exit 2,
		// as pepsi-dispatch does.
		fmt.Fprintf(stderr, "pepsi-ingress: traces: %v\n", err)
		return exitUsage
	}
	if traces != nil {
		defer traces.Close(context.Background())
		c.o.Traces = traces
	}
	srv := ingress.New(c.o.WithPool(pool))
	ln, err := net.Listen("tcp", c.ingress.Listen)
	if err != nil {
		srv.Close()
		return fail("%v", err)
	}
	hs := ingress.HTTPServer(srv, c.timeouts, log)
	scheme := "http"
	if cert != nil {
		scheme = "https"
		ln = tls.NewListener(ln, &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: cert.get})
	}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	log.Info("pepsi-ingress serving", "addr", scheme+"://"+ln.Addr().String()+"/v1/messages",
		"stages", strings.Join(c.stages, ","), "tokens", c.o.Tokens != nil, "max_pending", c.o.MaxPending,
		"database", cliflags.Redact(c.database), "database_from", c.dbFrom)
	if ready != nil {
		ready(ln.Addr().String())
	}
	for {
		select {
		case err := <-served:
			srv.Close()
			log.Error("pepsi-ingress stopped", "err", err)
			return exitFailure
		case <-hup:
			reload(log, c.o.Tokens, cert)
			continue
		case <-ctx.Done():
		}
		break
	}
	log.Info("pepsi-ingress stopping: no new connections; finishing the requests in flight", "grace", c.grace)
	sctx, cancel := context.WithTimeout(context.Background(), c.grace)
	defer cancel()
	code := exitOK
	if err := hs.ShutdownWithContext(sctx); err != nil {
		log.Error("requests still in flight at the end of the shutdown grace; their clients get no answer", "err", err)
		code = exitFailure
	}
	srv.Close()
	log.Info("pepsi-ingress stopped")
	return code
}

// reload re-reads the tokens and the certificate; a file that fails to load
// leaves what is in use as it was.
func reload(log *slog.Logger, tokens *bearer.Tokens, cert *certificate) {
	if tokens != nil {
		if n, err := tokens.Reload(); err != nil {
			log.Error("SIGHUP: tokens not reloaded; the old ones stay in use", "err", err)
		} else {
			log.Info("SIGHUP: tokens reloaded", "tokens", n)
		}
	}
	if cert != nil {
		if err := cert.reload(); err != nil {
			log.Error("SIGHUP: certificate not reloaded; the old one stays in use", "err", err)
		} else {
			log.Info("SIGHUP: certificate reloaded")
		}
	}
}

// schemaHint is what to do about err, the failure to read the schema
// version: run pepsi-queue migrate when the database has no PEPSI schema
// (PostgreSQL's bare "relation does not exist"), nothing else when it could
// not be read for another reason (a database that does not answer has
// nothing to migrate).
func schemaHint(err error) string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && (pg.Code == "42P01" || pg.Code == "3F000") { // undefined_table, invalid_schema_name
		return " (the database has no PEPSI schema: run pepsi-queue migrate)"
	}
	return ""
}

// connect opens a pool of size connections and checks the schema.
func connect(ctx context.Context, url string, size int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database connection string: %w", err)
	}
	cfg.MaxConns = int32(size)
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "pepsi-ingress"
	}
	// Its inserts decide a keyed message's status at READ COMMITTED (schema
	// 36), and a 202 answers a durable commit, whatever the database's or
	// the role's defaults; a wait for a lock another session holds ends
	// before the commit's timeout, with an error known to have committed
	// nothing.
	bound := store.BoundLockWaits(ingress.LockWait)
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if err := store.ProducerSession(ctx, conn); err != nil {
			return err
		}
		return bound(ctx, conn)
	}
	where := pgaddr.Where(&cfg.ConnConfig.Config)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	v, err := store.On(pool).SchemaVersion(ctx)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("%s: %w%s", where, err, schemaHint(err))
	}
	if v < schemaNeeded {
		pool.Close()
		return nil, fmt.Errorf("%s: schema version %d, pepsi-ingress needs %d or later (run pepsi-queue migrate)", where, v, schemaNeeded)
	}
	return pool, nil
}

// certificate is the server's TLS certificate, re-read on SIGHUP.
type certificate struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
}

func loadCertificate(certFile, keyFile string) (*certificate, error) {
	c := &certificate{certFile: certFile, keyFile: keyFile}
	if err := c.reload(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *certificate) reload() error {
	kp, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("TLS_CERT %s, TLS_KEY %s: %w", c.certFile, c.keyFile, err)
	}
	c.cur.Store(&kp)
	return nil
}

func (c *certificate) get(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.cur.Load(), nil }

// oneLine puts err on one line: pgx lists each address it tried on a line of
// its own.
func oneLine(err error) string {
	return strings.NewReplacer(":\n\t", ": ", "\n\t", "; ", "\n", " ").Replace(err.Error())
}
