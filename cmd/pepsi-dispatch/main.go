// Command pepsi-dispatch is the single long-lived coordinator that drives messages
// through the stages of a PEPSI pipeline. See docs/pepsi-dispatch.1.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pepsi-pipeline/pepsi/cmd/pepsi-dispatch/internal/hangup"
	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/internal/cliflags"
	"github.com/pepsi-pipeline/pepsi/internal/logflags"
	"github.com/pepsi-pipeline/pepsi/internal/tracing"
	"github.com/pepsi-pipeline/pepsi/shell/dispatch"
	"github.com/pepsi-pipeline/pepsi/shell/dispatchmetrics"
)

const usage = `pepsi-dispatch: run the PEPSI dispatcher.

Usage: pepsi-dispatch [flags]

It claims pending rows of pepsi.queue, feeds them to the stage programs named in
the configuration, and runs until SIGINT or SIGTERM (a second signal exits at once).
Exactly one may run per database; a second one exits with status 3 naming the
holder, or with -standby waits and takes over.

Every flag can also be set as a PEPSI_* environment variable (-max-runtime as
PEPSI_MAX_RUNTIME); flags and environment override the configuration file.

Exit status: 0 clean shutdown; 1 shut down with results unwritten (the next start
resets their rows); 2 bad flags or configuration; 3 another dispatcher holds the
lock; 4 the database or environment is unusable.

Flags:
`

func main() {
	// Caught here, not by dispatch.Run, and never let go: a signal during
	// the last export of traces, after Run, is the operator's second and
	// ends that wait (closeTraces), where Go's default would kill the
	// process and lose its exit status. (SIGHUP is caught earlier still:
	// package hangup.)
	stop := make(chan os.Signal, 2)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	// The dispatcher is one serial loop fed by pipe and socket reads. On one
	// processor the Go scheduler hands a ready goroutine over on the same thread
	// instead of waking another, which cuts its CPU per message by a sixth
	// (docs/performance.md). GOMAXPROCS in the environment still wins.
	if _, set := os.LookupEnv("GOMAXPROCS"); !set {
		runtime.GOMAXPROCS(1)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, signals{stop: stop, hup: hangup.C}))
}

// signals are the ones pepsi-dispatch acts on, caught until it exits.
type signals struct {
	stop <-chan os.Signal // SIGINT and SIGTERM; nil: dispatch.Run catches its own
	hup  <-chan os.Signal // SIGHUP, logged and ignored; nil when it stays ignored (nohup)
}

// tracesGCPercent is the garbage collector's GOGC while traces are
// exported: each span leaves about 6 KB of garbage behind, and the
// dispatcher's heap is small, so at the default 100 it would be collected
// over and over. The exporter's queues bound what it holds, so the heap
// stays bounded at five times the live data (GOGC 400).
const tracesGCPercent = 400

// tuneForTraces gives the span exporter a processor beside the loop's, and
// the collector tracesGCPercent, unless GOMAXPROCS or GOGC in the
// environment say otherwise; it returns what it left them at. Making,
// encoding and sending a span costs 10-20 µs of CPU (internal/tracing's
// BenchmarkPassSpans): on the loop's one processor that work delays the
// loop's every answer (docs/performance.md, "Traces").
func tuneForTraces() (procs int, gogc string) {
	if _, set := os.LookupEnv("GOMAXPROCS"); !set {
		runtime.GOMAXPROCS(min(2, runtime.NumCPU()))
	}
	gogc, set := os.LookupEnv("GOGC")
	if !set {
		debug.SetGCPercent(tracesGCPercent)
		gogc = strconv.Itoa(tracesGCPercent)
	}
	return runtime.GOMAXPROCS(0), gogc
}

// run is the whole program; it returns the exit code. The help and the
// version, asked for, go to stdout; everything else to stderr.
func run(args []string, stdout, stderr io.Writer, sig signals) int {
	fs := cliflags.NewFlagSet("pepsi-dispatch", usage, stdout)
	var (
		configFile = fs.String("c", "/etc/pepsi/pepsi.conf", "configuration `file` (pepsi.conf(5))")
		database   = fs.String("database", "", "database `URL` or key=value string; overrides [pepsi] DATABASE")
		standby    = fs.Bool("standby", false, "wait for the running dispatcher to go away instead of refusing to start")
		logFormat  = fs.String("log-format", "text", "log format: text or json")
		logLevel   = fs.String("log-level", "info", "log level: debug, info, warn or error")
		cpuProfile = fs.String("cpuprofile", "", "write a CPU profile (go tool pprof) to `file` until exit")
		metrics    = fs.String("metrics-addr", "", "serve this dispatcher's live state as Prometheus metrics on `host:port` (/metrics); off when empty")
		ov         overrides
	)
	ov.flags(fs)
	parsed, err := cliflags.Parse(fs, args, "PEPSI")
	if err != nil {
		return cliflags.Fail(stderr, "pepsi-dispatch", err)
	}
	if fs.NArg() > 0 {
		return cliflags.Fail(stderr, "pepsi-dispatch", fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	log, err := logflags.New(stderr, *logFormat, *logLevel, parsed.Name)
	if err != nil {
		return cliflags.Fail(stderr, "pepsi-dispatch", err)
	}
	if sig.hup != nil {
		defer dispatch.WarnHangups(log, sig.hup)()
	}
	cfg, ok := configure(log, *configFile, ov, parsed.Name)
	if !ok {
		return dispatch.ExitUsage
	}
	db, dbFrom := parsed.Database(log, *database, *configFile, cfg.Database)
	names := make([]string, len(cfg.Stages))
	for i, s := range cfg.Stages {
		names[i] = s.Name
	}
	if *cpuProfile != "" {
		stop, err := startCPUProfile(*cpuProfile)
		if err != nil {
			log.Error("cannot start the CPU profile", "err", err)
			return dispatch.ExitUsage
		}
		defer stop(log)
	}
	opts := dispatch.Options{Config: cfg, Database: db, Standby: *standby, Log: log, Signals: sig.stop}
	traces, err := tracing.New(context.Background(), "pepsi-dispatch", log)
	if err != nil {
		log.Error("cannot export traces", "err", err)
		return dispatch.ExitUsage
	}
	if traces != nil {
		opts.Traces = traces
		defer closeTraces(traces, sig.stop, log)
		procs, gc := tuneForTraces()
		log.Info("exporting traces (OpenTelemetry environment)", "service", "pepsi-dispatch", "gomaxprocs", procs, "gogc", gc)
	}
	if *metrics != "" {
		asks, stopMetrics, err := serveMetrics(*metrics, traces, log)
		if err != nil {
			log.Error("cannot serve metrics", "err", err)
			return dispatch.ExitFatal
		}
		defer stopMetrics()
		opts.Snapshots = asks
	}
	log.Info("pepsi-dispatch starting", "config", *configFile, "stages", strings.Join(names, ","),
		"database", cliflags.Redact(db), "database_from", dbFrom)
	code, err := dispatch.Run(context.Background(), opts)
	switch {
	case code == dispatch.ExitLockHeld:
		log.Error("pepsi-dispatch not started", "err", err, "exit", code)
	case err != nil:
		log.Error("pepsi-dispatch stopped", "err", err, "exit", code)
	default:
		log.Info("pepsi-dispatch stopped", "exit", code)
	}
	return code
}

// closeTraces waits for the last export of traces (Exporter.Close: 5 s at
// most) unless a signal comes meanwhile: the operator's second, asking to
// exit now, which it does with the status the dispatcher decided.
func closeTraces(traces *tracing.Exporter, stop <-chan os.Signal, log *slog.Logger) {
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case s := <-stop:
			log.Warn("signal received while exporting the last traces: exiting without waiting for them", "signal", s.String())
			cancel()
		case <-ctx.Done():
		}
	}()
	traces.Close(ctx)
	cancel()
	<-watched
}

// overrides are the flags that override keys of the configuration's
// [pepsi-dispatch] section; "" is a flag not given.
type overrides struct {
	maxRuntime, idle, poll, stats, grace, vacuum, sessions string
}

// flags defines the flags that override [pepsi-dispatch] keys.
func (ov *overrides) flags(fs *flag.FlagSet) {
	fs.StringVar(&ov.maxRuntime, "max-runtime", "", "override [pepsi-dispatch] MAX_RUNTIME, the watchdog of stages without their own (seconds or a duration like 5m)")
	fs.StringVar(&ov.idle, "worker-idle-timeout", "", "override WORKER_IDLE_TIMEOUT")
	fs.StringVar(&ov.poll, "poll-interval", "", "override POLL_INTERVAL")
	fs.StringVar(&ov.stats, "stats-interval", "", "override STATS_INTERVAL")
	fs.StringVar(&ov.grace, "stop-grace", "", "override STOP_GRACE")
	fs.StringVar(&ov.vacuum, "vacuum", "", "override VACUUM (on or off): vacuum pepsi.queue when dead rows pile up")
	fs.StringVar(&ov.sessions, "sessions", "", "override SESSIONS: the queue transactions in flight at once, each on a database session of its own")
}

// configure reads and parses the configuration file and applies the flags that
// override it; name says where the operator set a flag (the flag itself or its
// PEPSI_ variable). It logs what is wrong, if anything, and then answers false.
func configure(log *slog.Logger, file string, ov overrides, name func(flag string) string) (*conf.Config, bool) {
	text, err := os.ReadFile(file)
	if err != nil {
		log.Error("cannot read the configuration", "err", err)
		return nil, false
	}
	cfg, err := conf.Parse(file, string(text))
	if err != nil {
		log.Error("bad configuration", "err", err)
		return nil, false
	}
	if why := unshared(file); why != "" && !cfg.Dispatch.ConfigFileSet {
		log.Error("the configuration cannot be handed on to the workers as -c "+file+": "+why+"; set [pepsi-dispatch] CONFIG_FILE to a file they can read", "file", file)
		return nil, false
	}
	if !cfg.Dispatch.ConfigFileSet && !filepath.IsAbs(file) {
		// Workers are handed the file as the dispatcher found it, from
		// wherever they run: a relative path would tie them to its working
		// directory, as a relative PROGRAM would (refused for that).
		// (Without a working directory to resolve it against, the path is
		// left as given: the workers inherit the same missing one.)
		if abs, err := filepath.Abs(file); err == nil {
			cfg.Dispatch.ConfigFile = abs
		}
	}
	for _, o := range []struct {
		flag, value string
		set         func(string) error
	}{
		{"max-runtime", ov.maxRuntime, durationInto(&cfg.Dispatch.MaxRuntime)},
		{"worker-idle-timeout", ov.idle, durationInto(&cfg.Dispatch.IdleTimeout)},
		{"poll-interval", ov.poll, func(s string) (err error) { cfg.Dispatch.PollInterval, err = conf.ParsePollInterval(s); return err }},
		{"stats-interval", ov.stats, durationInto(&cfg.Dispatch.StatsInterval)},
		{"stop-grace", ov.grace, durationInto(&cfg.Dispatch.StopGrace)},
		{"vacuum", ov.vacuum, func(s string) (err error) { cfg.Dispatch.Vacuum, err = conf.ParseOnOff(s); return err }},
		{"sessions", ov.sessions, func(s string) (err error) { cfg.Dispatch.Sessions, err = conf.ParseSessions(s); return err }},
	} {
		if o.value == "" {
			continue
		}
		if err := o.set(o.value); err != nil {
			// The flag, or the PEPSI_ variable that set it: where the operator must look.
			log.Error("bad value", "setting", name(o.flag), "err", err)
			return nil, false
		}
	}
	if len(cfg.Stages) == 0 {
		log.Error("the configuration defines no [stage-NAME] section: nothing to dispatch", "file", file)
		return nil, false
	}
	return cfg, true
}

// unshared says why file, which the dispatcher has just read, is no file its
// workers can read as "-c FILE" (the default CONFIG_FILE), or "" when it is
// one: a descriptor of the dispatcher's own (/dev/stdin, /dev/fd/N,
// /proc/self/fd/N) names the worker's own descriptor in the worker, and its
// standard input is its messages, which a stage reading its configuration
// from there would take for it and never answer; and a named pipe or a
// device gives each reader something else, or nothing.
func unshared(file string) string {
	abs, err := filepath.Abs(file)
	if err != nil {
		return ""
	}
	switch {
	case abs == "/dev/stdin" || abs == "/dev/stdout" || abs == "/dev/stderr",
		strings.HasPrefix(abs, "/dev/fd/"), strings.HasPrefix(abs, "/proc/self/fd/"),
		strings.HasPrefix(abs, "/proc/thread-self/fd/"):
		return "it names a file descriptor of pepsi-dispatch, and a worker would open its own (its standard input is its messages)"
	}
	if fi, err := os.Stat(file); err == nil && !fi.Mode().IsRegular() {
		what := "a device"
		switch {
		case fi.Mode()&os.ModeNamedPipe != 0:
			what = "a named pipe"
		case fi.Mode()&os.ModeSocket != 0:
			what = "a socket"
		}
		return "it is " + what + ", not a regular file, and each worker would read it anew"
	}
	return ""
}

// serveMetrics serves the dispatcher's live state as Prometheus metrics on
// addr until stop is called. The collector asks the dispatcher through asks
// (dispatch.Options.Snapshots).
func serveMetrics(addr string, traces *tracing.Exporter, log *slog.Logger) (asks chan chan<- core.Snapshot, stop func(), err error) {
	ln, err := dispatchmetrics.Listen(addr)
	if err != nil {
		return nil, nil, err
	}
	asks = make(chan chan<- core.Snapshot)
	ctx, stop := context.WithCancel(context.Background())
	c := dispatchmetrics.NewCollector(asks)
	if traces != nil {
		c.Spans = traces
	}
	go dispatchmetrics.Serve(ctx, ln, c, log)
	log.Info("serving metrics", "addr", "http://"+ln.Addr().String()+"/metrics")
	return asks, stop, nil
}

// startCPUProfile profiles the process into file until the returned stop is
// called (pepsi-bench -cpuprofile uses it to see where the dispatcher's time goes).
func startCPUProfile(file string) (stop func(*slog.Logger), err error) {
	f, err := os.Create(file)
	if err != nil {
		return nil, fmt.Errorf("-cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("-cpuprofile: %w", err)
	}
	return func(log *slog.Logger) {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			log.Error("writing the CPU profile", "file", file, "err", err)
		}
	}, nil
}

func durationInto(d *time.Duration) func(string) error {
	return func(s string) error {
		v, err := conf.ParseDuration(s)
		if err != nil {
			return err
		}
		*d = v
		return nil
	}
}
