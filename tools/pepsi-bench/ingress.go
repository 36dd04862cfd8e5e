package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/valyala/fasthttp"

	"github.com/pepsi-pipeline/pepsi/store"
)

// The ingress figures (-ingress), side by side in one run, each on a fresh
// database: pgbench's single-row INSERTs into pepsi.queue from -clients
// clients beside single-message requests to pepsi-ingress from
// -ingress-clients keep-alive clients; pepsi-queue enqueue -ndjson beside
// NDJSON requests of -ingress-batch messages each, the same messages, one
// producer each; and the time from accepted over HTTP to done through the
// three answering stages at -latency-rate.
//
// The load generator is a closed loop (each client sends its next request
// when the last is answered) of keep-alive connections on fasthttp's client
// (newLoadClient says why that one), with every latency kept. Closed loops
// are what the figure is about (so many clients, as fast as answered); a rate
// attacker such as vegeta runs open loop on net/http's client.

// ingressSettings are the -ingress flags.
type ingressSettings struct {
	on      bool
	clients int
	batch   int
	total   int
	binary  string
	queue   string
	args    string
}

func ingressFlags(fs *flag.FlagSet) *ingressSettings {
	s := &ingressSettings{}
	fs.BoolVar(&s.on, "ingress", false, "instead of the rounds: measure pepsi-ingress beside pgbench and pepsi-queue enqueue, and its accepted → done latency")
	fs.IntVar(&s.clients, "ingress-clients", 64, "concurrent keep-alive HTTP clients sending single-message requests")
	fs.IntVar(&s.batch, "ingress-batch", 1000, "messages per NDJSON request (and per pepsi-queue enqueue -batch)")
	fs.IntVar(&s.total, "ingress-total", 100000, "messages of the NDJSON comparison")
	fs.StringVar(&s.binary, "ingress-binary", "", "the pepsi-ingress `binary` (default: next to pepsi-bench, else on PATH)")
	fs.StringVar(&s.args, "ingress-args", "", "more `flags` for pepsi-ingress, separated by blanks (-committers 2 -batch-wait 1ms)")
	fs.StringVar(&s.queue, "queue-binary", "", "the pepsi-queue `binary` (default: next to pepsi-bench, else on PATH)")
	return s
}

// findProgram looks for name next to pepsi-bench, then on PATH.
func findProgram(self, name string) (string, error) {
	p := filepath.Join(filepath.Dir(self), name)
	if isExecutable(p) {
		return p, nil
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%s is neither next to pepsi-bench (%s) nor on PATH: run \"make build\"", name, p)
}

// ingressRound is what one round of the ingress figures found.
type ingressRound struct {
	pgbenchTPS     float64
	single         loadResult
	queueRate      float64 // pepsi-queue enqueue, messages/s
	ndjsonRate     float64 // NDJSON requests, messages/s
	ndjsonRequests loadResult
	// singleServerCPU is pepsi-ingress's CPU time (user + system) over its
	// life in the single-message run.
	singleServerCPU time.Duration
	// singleDatabaseCPU is the CPU time of pepsi-ingress's PostgreSQL
	// backends (they start with it), -1 where they cannot be read (a server
	// on another machine).
	singleDatabaseCPU time.Duration
	// singleBusy is the share of the machine's CPU time that was busy (any
	// process) during the single-message run: near 1, the run was bound by
	// CPU; well below, by waiting (commits, the batch wait).
	singleBusy float64
	// batch is pepsi-ingress's group commit in the single-message run.
	batch batchFigures
}

// batchFigures are the averages of pepsi-ingress's group commit, from its
// metrics.
type batchFigures struct {
	requests float64       // requests per committed transaction
	commit   time.Duration // time of one try of a transaction, BEGIN to COMMIT's answer
}

// readBatches reads the group commit's averages from pepsi-ingress's
// /metrics, next to messagesURL.
func readBatches(ctx context.Context, messagesURL string) (batchFigures, error) {
	var f batchFigures
	u, err := url.Parse(messagesURL)
	if err != nil {
		return f, err
	}
	u.Path, u.RawQuery = "/metrics", ""
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return f, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return f, fmt.Errorf("read pepsi-ingress's metrics: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return f, fmt.Errorf("read pepsi-ingress's metrics: %s", res.Status)
	}
	values := map[string]float64{}
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			values[name] = v
		}
	}
	if err := sc.Err(); err != nil {
		return f, fmt.Errorf("read pepsi-ingress's metrics: %w", err)
	}
	n := values["pepsi_ingress_batch_requests_count"]
	tries := values["pepsi_ingress_commit_seconds_count"]
	if n == 0 || tries == 0 {
		return f, errors.New("pepsi-ingress's metrics show no committed batch")
	}
	f.requests = values["pepsi_ingress_batch_requests_sum"] / n
	f.commit = time.Duration(values["pepsi_ingress_commit_seconds_sum"] / tries * float64(time.Second))
	return f, nil
}

// machineCPU is the machine's busy and total CPU time so far, in clock ticks
// (the first line of /proc/stat; idle and iowait are not busy); zeros where
// it cannot be read.
func machineCPU() (busy, total uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, 0
	}
	for i, x := range f[1:] {
		v, err := strconv.ParseUint(x, 10, 64)
		if err != nil {
			return 0, 0
		}
		// Fields 4 and 5 are idle and iowait; guest time (9, 10) is already
		// counted in user time.
		switch i + 1 {
		case 4, 5:
			total += v
		case 9, 10:
		default:
			busy += v
			total += v
		}
	}
	return busy, total
}

// runIngress measures the ingress figures -rounds times and prints them.
func (b *bench) runIngress(ctx context.Context, s *ingressSettings) error {
	if s.clients <= 0 || s.batch <= 0 || s.total < s.batch {
		return errors.New("-ingress-clients and -ingress-batch must be positive, -ingress-total at least -ingress-batch")
	}
	if err := b.prepare(); err != nil {
		return err
	}
	keep := b.keep
	defer func() {
		if keep {
			fmt.Fprintf(b.out, "configuration and logs kept in %s\n", b.dir)
			return
		}
		os.RemoveAll(b.dir)
	}()
	var err error
	if s.binary == "" {
		if s.binary, err = findProgram(b.self, "pepsi-ingress"); err != nil {
			return err
		}
	}
	if s.queue == "" {
		if s.queue, err = findProgram(b.self, "pepsi-queue"); err != nil {
			return err
		}
	}
	fmt.Fprintf(b.out, "pepsi-bench -ingress: %d rounds of %d s; pgbench -c %d single-row INSERTs into pepsi.queue vs %d keep-alive clients sending one message per request; "+
		"pepsi-queue enqueue -ndjson -batch %d vs NDJSON requests of %d messages from one client, %d messages each\n",
		b.rounds, b.seconds, b.clients, s.clients, s.batch, s.batch, s.total)
	var rounds []ingressRound
	for i := 1; i <= b.rounds; i++ {
		r, err := b.ingressRound(ctx, s)
		if err != nil {
			keep = true
			return fmt.Errorf("round %d: %w", i, err)
		}
		fmt.Fprintf(b.out, "round %d (load average %s): pgbench %.0f tps; single-message requests %s = %.2f× pgbench, CPU per request: load generator %.1f µs, pepsi-ingress %.1f µs, its PostgreSQL sessions %s, machine busy %.0f%%, %.1f requests per transaction, commit %.1f ms; "+
			"pepsi-queue enqueue %.0f msg/s; NDJSON requests %.0f msg/s = %.2f× pepsi-queue (request p50 %.1f ms, p99 %.1f ms)\n",
			i, loadAverage(), r.pgbenchTPS, r.single, r.single.rate/r.pgbenchTPS, perRequest(r.single.clientCPU, r.single.requests), perRequest(r.singleServerCPU, r.single.requests),
			backendsPerRequest(r.singleDatabaseCPU, r.single.requests), 100*r.singleBusy, r.batch.requests, ms(r.batch.commit),
			r.queueRate, r.ndjsonRate, r.ndjsonRate/r.queueRate, ms(r.ndjsonRequests.p50), ms(r.ndjsonRequests.p99))
		rounds = append(rounds, r)
	}
	med := func(f func(ingressRound) float64) float64 {
		var xs []float64
		for _, r := range rounds {
			xs = append(xs, f(r))
		}
		return median(xs)
	}
	fmt.Fprintf(b.out, "\nmedian of %d rounds:\n", len(rounds))
	fmt.Fprintf(b.out, "  pgbench, %d clients, single-row INSERTs into pepsi.queue   %8.0f tps\n", b.clients, med(func(r ingressRound) float64 { return r.pgbenchTPS }))
	fmt.Fprintf(b.out, "  pepsi-ingress, %d clients, one message per request        %8.0f msg/s  ratio %.2f×  p50 %.1f ms  p99 %.1f ms\n", s.clients,
		med(func(r ingressRound) float64 { return r.single.rate }), med(func(r ingressRound) float64 { return r.single.rate / r.pgbenchTPS }),
		med(func(r ingressRound) float64 { return ms(r.single.p50) }), med(func(r ingressRound) float64 { return ms(r.single.p99) }))
	fmt.Fprintf(b.out, "    CPU per request: load generator %.1f µs, pepsi-ingress %.1f µs\n",
		med(func(r ingressRound) float64 { return perRequest(r.single.clientCPU, r.single.requests) }),
		med(func(r ingressRound) float64 { return perRequest(r.singleServerCPU, r.single.requests) }))
	fmt.Fprintf(b.out, "  pepsi-queue enqueue -ndjson -batch %d                     %8.0f msg/s\n", s.batch, med(func(r ingressRound) float64 { return r.queueRate }))
	fmt.Fprintf(b.out, "  pepsi-ingress, NDJSON requests of %d, one client           %8.0f msg/s  ratio %.2f×\n", s.batch,
		med(func(r ingressRound) float64 { return r.ndjsonRate }), med(func(r ingressRound) float64 { return r.ndjsonRate / r.queueRate }))
	l, err := b.ingressLatency(ctx, s)
	if err != nil {
		keep = true
		return fmt.Errorf("latency: %w", err)
	}
	fmt.Fprintf(b.out, "  accepted over HTTP → done, a -> b -> c -> done (answer mode): %s\n", l)
	return nil
}

// ingressRound measures pgbench, the single-message requests, pepsi-queue
// enqueue and the NDJSON requests, each on a fresh database.
func (b *bench) ingressRound(ctx context.Context, s *ingressSettings) (ingressRound, error) {
	var r ingressRound
	var err error
	if r.pgbenchTPS, err = b.ingressPgbench(ctx); err != nil {
		return r, err
	}
	if err = b.ingressSingle(ctx, s, &r); err != nil {
		return r, err
	}
	// The same NDJSON through pepsi-queue enqueue, then pepsi-ingress.
	var lines bytes.Buffer
	for i := range s.total {
		fmt.Fprintf(&lines, "{\"payload\": \"message %d\", \"state\": {\"n\": %d}}\n", i, i)
	}
	if r.queueRate, err = b.ingressQueue(ctx, s, lines.Bytes()); err != nil {
		return r, err
	}
	r.ndjsonRequests, r.ndjsonRate, err = b.ingressNDJSON(ctx, s, lines.Bytes())
	return r, err
}

// ingressPgbench is pgbench's rate of single-row INSERTs into pepsi.queue,
// with its triggers and no dispatcher.
func (b *bench) ingressPgbench(ctx context.Context) (tps float64, err error) {
	if _, err = b.migrated(ctx); err != nil {
		return 0, err
	}
	script := filepath.Join(b.dir, "ingest.sql")
	if err := os.WriteFile(script, []byte(ingestScript), 0o600); err != nil {
		return 0, err
	}
	args := []string{"-n", "-c", strconv.Itoa(b.clients), "-j", "2", "-T", strconv.Itoa(b.seconds), "-f", script, b.url}
	out, err := exec.CommandContext(ctx, b.pgbench, args...).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w\n%s", b.pgbench, strings.Join(args, " "), err, out)
	}
	return parseTPS(out)
}

// ingressSingle measures into r what s.clients keep-alive clients posting one
// message per request achieve for b.seconds, the CPU time pepsi-ingress and
// its database sessions spent on them, how busy the machine was meanwhile,
// and the group commit's averages.
func (b *bench) ingressSingle(ctx context.Context, s *ingressSettings, r *ingressRound) error {
	conn, err := b.migrated(ctx)
	if err != nil {
		return err
	}
	ing, err := b.startIngress(ctx, s, "single")
	if err != nil {
		return err
	}
	single := []byte(`{"stage": "a", "payload": "ingest"}`)
	busy0, total0 := machineCPU()
	r.single, err = load(ctx, ing.url, s.clients, time.Duration(b.seconds)*time.Second, "application/json", func(int) []byte { return single })
	if busy1, total1 := machineCPU(); total1 > total0 {
		r.singleBusy = float64(busy1-busy0) / float64(total1-total0)
	}
	if err == nil {
		r.batch, err = readBatches(ctx, ing.url)
	}
	r.singleDatabaseCPU = -1
	if cpu, known := backendsCPU(ctx, conn); known {
		r.singleDatabaseCPU = cpu
	}
	if err2 := ing.stop(); err == nil {
		err = err2
	}
	if err != nil {
		return err
	}
	r.singleServerCPU = ing.cpu
	return checkRows(ctx, conn, r.single.messages)
}

// ingressQueue is the rate, in messages a second, of pepsi-queue enqueue
// -ndjson reading lines from a file.
func (b *bench) ingressQueue(ctx context.Context, s *ingressSettings, lines []byte) (float64, error) {
	file := filepath.Join(b.dir, "messages.ndjson")
	if err := os.WriteFile(file, lines, 0o600); err != nil {
		return 0, err
	}
	conn, err := b.migrated(ctx)
	if err != nil {
		return 0, err
	}
	in, err := os.Open(file)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	cmd := exec.CommandContext(ctx, s.queue, "-database", b.url, "enqueue", "-stage", "a", "-ndjson", "-batch", strconv.Itoa(s.batch))
	cmd.Stdin = in
	start := time.Now()
	out, err := cmd.CombinedOutput()
	elapsed := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("pepsi-queue enqueue: %w\n%s", err, out)
	}
	return float64(s.total) / elapsed.Seconds(), checkRows(ctx, conn, int64(s.total))
}

// ingressNDJSON posts lines to pepsi-ingress in NDJSON requests of s.batch
// lines from one client: the requests' figures and the messages' rate.
func (b *bench) ingressNDJSON(ctx context.Context, s *ingressSettings, lines []byte) (loadResult, float64, error) {
	conn, err := b.migrated(ctx)
	if err != nil {
		return loadResult{}, 0, err
	}
	ing, err := b.startIngress(ctx, s, "ndjson")
	if err != nil {
		return loadResult{}, 0, err
	}
	bodies := batches(lines, s.batch)
	start := time.Now()
	r, err := loadN(ctx, ing.url+"?stage=a", 1, "application/x-ndjson", bodies)
	elapsed := time.Since(start)
	if err2 := ing.stop(); err == nil {
		err = err2
	}
	if err != nil {
		return loadResult{}, 0, err
	}
	return r, float64(s.total) / elapsed.Seconds(), checkRows(ctx, conn, int64(s.total))
}

// batches cuts lines into bodies of n lines each (the last may hold fewer).
func batches(lines []byte, n int) [][]byte {
	var bodies [][]byte
	for len(lines) > 0 {
		cut := 0
		for range n {
			i := bytes.IndexByte(lines[cut:], '\n')
			if i < 0 {
				cut = len(lines)
				break
			}
			cut += i + 1
		}
		bodies = append(bodies, lines[:cut])
		lines = lines[cut:]
	}
	return bodies
}

// loadAverage is the machine's 1-minute load average, "?" where it cannot be
// read: the figures of a shared machine mean little without it.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

// backendsPerRequest is perRequest for the database sessions' CPU, "?" where
// it could not be read.
func backendsPerRequest(cpu time.Duration, n int64) string {
	if cpu < 0 {
		return "?"
	}
	return fmt.Sprintf("%.1f µs", perRequest(cpu, n))
}

// perRequest is cpu over n requests, in microseconds.
func perRequest(cpu time.Duration, n int64) float64 {
	if n == 0 {
		return 0
	}
	return float64(cpu) / float64(time.Microsecond) / float64(n)
}

// migrated makes a fresh bench database with the schema.
func (b *bench) migrated(ctx context.Context) (*pgx.Conn, error) {
	if err := b.freshDatabase(ctx); err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, b.url)
	if err != nil {
		return nil, fmt.Errorf("connect to the bench database: %w", err)
	}
	if _, err := store.Migrate(ctx, conn); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("apply the schema: %w", err)
	}
	return conn, nil
}

// checkRows checks that the queue holds exactly n rows: every 202 committed.
func checkRows(ctx context.Context, conn *pgx.Conn, n int64) error {
	defer conn.Close(context.WithoutCancel(ctx))
	var got int64
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pepsi.queue").Scan(&got); err != nil {
		return fmt.Errorf("count the queue: %w", err)
	}
	if got != n {
		return fmt.Errorf("the queue holds %d rows, want %d (the messages answered 202)", got, n)
	}
	return nil
}

// ingressProcess is one running pepsi-ingress.
type ingressProcess struct {
	cmd    *exec.Cmd
	url    string
	exited chan int
	log    string
	cpu    time.Duration // user + system CPU time, once exited
}

// startIngress starts pepsi-ingress on the bench database with stages a, b
// and c, and waits until it serves.
func (b *bench) startIngress(ctx context.Context, s *ingressSettings, tag string) (*ingressProcess, error) {
	confFile, err := b.writeConf(variant{mode: modeAnswer, cfg: b.benchConfig}, "60", "ingress-"+tag)
	if err != nil {
		return nil, err
	}
	logFile := filepath.Join(b.dir, "pepsi-ingress."+tag+".log")
	f, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	args := append([]string{"-c", confFile, "-listen", "127.0.0.1:0", "-max-in-flight", strconv.Itoa(max(256, 2*s.clients))}, strings.Fields(s.args)...)
	cmd := exec.Command(s.binary, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PEPSI_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = f, io.MultiWriter(f, pw)
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", s.binary, err)
	}
	p := &ingressProcess{cmd: cmd, exited: make(chan int, 1), log: logFile}
	go func() {
		_ = cmd.Wait() // the exit status is read from ProcessState
		pw.Close()
		f.Close()
		p.cpu = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		p.exited <- cmd.ProcessState.ExitCode()
	}()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if _, rest, ok := strings.Cut(sc.Text(), "addr="); ok {
				addr <- strings.Fields(rest)[0]
				break
			}
		}
		io.Copy(io.Discard, pr) //nolint:errcheck // drains the pipe until the process exits
	}()
	select {
	case p.url = <-addr:
		return p, nil
	case code := <-p.exited:
		return nil, fmt.Errorf("pepsi-ingress exited with status %d before serving; see %s", code, logFile)
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		return nil, fmt.Errorf("pepsi-ingress did not serve within 30 s; see %s", logFile)
	case <-ctx.Done():
		cmd.Process.Kill()
		return nil, ctx.Err()
	}
}

// stop sends SIGTERM and waits for exit status 0.
func (p *ingressProcess) stop() error {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("signal pepsi-ingress: %w", err)
	}
	select {
	case code := <-p.exited:
		if code != 0 {
			return fmt.Errorf("pepsi-ingress exited with status %d after SIGTERM (want 0); see %s", code, p.log)
		}
		return nil
	case <-time.After(stopWait):
		p.cmd.Process.Kill()
		return fmt.Errorf("pepsi-ingress did not exit within %v of SIGTERM; killed it", stopWait)
	}
}

// loadResult is what a load run found.
type loadResult struct {
	requests, messages int64
	rate               float64 // messages per second
	p50, p99           time.Duration
	clientCPU          time.Duration // the load generator's own CPU time (user + system)
}

func (l loadResult) String() string {
	return fmt.Sprintf("%.0f msg/s (request p50 %.1f ms, p99 %.1f ms)", l.rate, ms(l.p50), ms(l.p99))
}

// newLoadClient is the load generator's HTTP client for url: fasthttp's
// HostClient with up to conns keep-alive connections to url's host. It is
// the client of a well-kept load generator (bombardier's): per request it
// reuses one request and one response object per client and runs on the
// calling goroutine, where net/http's client (this bench's first) allocates
// each request anew and hands it to a reader and a writer goroutine per
// connection. The client shares the two cores with pepsi-ingress and
// PostgreSQL, so its CPU per request is taken from what is measured:
// profiled, net/http's client cost almost as much CPU per request as
// pepsi-ingress itself.
func newLoadClient(rawURL string, conns int) (*fasthttp.HostClient, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("pepsi-ingress's address %q: %w", rawURL, err)
	}
	if u.Scheme != "http" {
		return nil, fmt.Errorf("pepsi-ingress's address %q: want http://", rawURL)
	}
	return &fasthttp.HostClient{
		Addr:                     u.Host,
		MaxConns:                 conns,
		MaxConnWaitTimeout:       time.Minute,
		ReadTimeout:              time.Minute,
		WriteTimeout:             time.Minute,
		NoDefaultUserAgentHeader: true,
	}, nil
}

// poster sends requests to one URL on one client, reusing its request and
// response: one per closed-loop client, used by one goroutine at a time.
type poster struct {
	c   *fasthttp.HostClient
	url string
	req *fasthttp.Request
	res *fasthttp.Response
}

func newPoster(c *fasthttp.HostClient, url, contentType string) *poster {
	p := &poster{c: c, url: url, req: fasthttp.AcquireRequest(), res: fasthttp.AcquireResponse()}
	p.req.SetRequestURI(url)
	p.req.Header.SetMethod(http.MethodPost)
	p.req.Header.SetContentType(contentType)
	return p
}

// post sends body (which must not change until post returns) and checks that
// it was answered 202.
func (p *poster) post(body []byte) error {
	p.req.SetBodyRaw(body)
	if err := p.c.Do(p.req, p.res); err != nil {
		return fmt.Errorf("POST %s: %w", p.url, err)
	}
	if code := p.res.StatusCode(); code != http.StatusAccepted {
		return fmt.Errorf("POST %s: %d %s", p.url, code, p.res.Body())
	}
	return nil
}

func (p *poster) release() {
	fasthttp.ReleaseRequest(p.req)
	fasthttp.ReleaseResponse(p.res)
}

// cpuTime is the CPU time (user and system) this process has used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// load runs clients closed-loop clients against url for d, each request the
// body of its client and sequence number; every answer must be 202.
func load(ctx context.Context, url string, clients int, d time.Duration, contentType string, body func(int) []byte) (loadResult, error) {
	client, err := newLoadClient(url, clients)
	if err != nil {
		return loadResult{}, err
	}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	cpu0 := cpuTime()
	start := time.Now()
	deadline := start.Add(d)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := newPoster(client, url, contentType)
			defer p.release()
			mine := make([]time.Duration, 0, 4096)
			for i := 0; ctx.Err() == nil; i++ {
				t := time.Now()
				if !t.Before(deadline) {
					break
				}
				if err := p.post(body(i)); err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
					return
				}
				mine = append(mine, time.Since(t))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return loadResult{}, firstErr
	}
	r := summarize(lat, int64(len(lat)), time.Since(start))
	r.clientCPU = cpuTime() - cpu0
	return r, nil
}

// loadN sends bodies from clients closed-loop clients, each body once.
func loadN(ctx context.Context, url string, clients int, contentType string, bodies [][]byte) (loadResult, error) {
	client, err := newLoadClient(url, clients)
	if err != nil {
		return loadResult{}, err
	}
	defer client.CloseIdleConnections()
	next := make(chan []byte, len(bodies))
	for _, b := range bodies {
		next <- b
	}
	close(next)
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	cpu0 := cpuTime()
	start := time.Now()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := newPoster(client, url, contentType)
			defer p.release()
			for b := range next {
				if ctx.Err() != nil {
					return
				}
				t := time.Now()
				err := p.post(b)
				mu.Lock()
				if err != nil {
					firstErr = cmpErr(firstErr, err)
				} else {
					lat = append(lat, time.Since(t))
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	if firstErr != nil {
		return loadResult{}, firstErr
	}
	r := summarize(lat, int64(len(lat)), time.Since(start))
	r.clientCPU = cpuTime() - cpu0
	return r, nil
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// postOne sends one request with net/http's client (the latency run's open
// loop, at a rate far below what the client costs) and checks it was
// answered 202.
func postOne(ctx context.Context, client *http.Client, url, contentType string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", contentType)
	res, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("POST %s: %w", url, err)
	}
	answer, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusAccepted {
		return fmt.Errorf("POST %s: %d %s", url, res.StatusCode, answer)
	}
	return nil
}

// summarize is the rate of messages over elapsed and the latencies' p50 and
// p99 (each request is one message unless messages says otherwise).
func summarize(lat []time.Duration, messages int64, elapsed time.Duration) loadResult {
	slices.Sort(lat)
	at := func(q float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(q*float64(len(lat))))]
	}
	return loadResult{requests: int64(len(lat)), messages: messages, rate: float64(messages) / elapsed.Seconds(), p50: at(0.5), p99: at(0.99)}
}

// ingressLatency runs the pipeline in answer mode with pepsi-ingress in front,
// offers -latency-rate single-message requests per second for
// -latency-seconds, and reports the time from accepted to done on the
// server's clock (created_at, the inserting transaction's start, to
// updated_at of the transaction that wrote done).
func (b *bench) ingressLatency(ctx context.Context, s *ingressSettings) (latencyResult, error) {
	var l latencyResult
	conn, err := b.migrated(ctx)
	if err != nil {
		return l, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	v := variant{mode: modeAnswer, cfg: b.benchConfig}
	confFile, err := b.writeConf(v, "60", "ingress-latency")
	if err != nil {
		return l, err
	}
	d, err := b.startDispatcher(confFile, "ingress-latency")
	if err != nil {
		return l, err
	}
	defer d.Kill()
	ing, err := b.startIngress(ctx, s, "latency")
	if err != nil {
		return l, err
	}
	defer ing.stop() //nolint:errcheck // stopped below; this is for early returns
	client := &http.Client{}
	// Warm the workers up first, as the pipeline's own latency figure does.
	for range latencyWarmup {
		if err := postOne(ctx, client, ing.url, "application/json", []byte(`{"stage": "a", "payload": "warm-up"}`)); err != nil {
			return l, err
		}
	}
	if err := b.waitDone(ctx, conn, d, v, latencyWarmup); err != nil {
		return l, fmt.Errorf("warm-up: %w", err)
	}
	total := b.latencyRate * max(1, b.latencySeconds)
	every := time.Second / time.Duration(b.latencyRate)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, total)
	for i := range total {
		if wait := time.Until(start.Add(time.Duration(i) * every)); wait > 0 {
			time.Sleep(wait)
		}
		wg.Add(1)
		go func() { // open loop: a slow answer does not delay the next request
			defer wg.Done()
			if err := postOne(ctx, client, ing.url, "application/json", []byte(`{"stage": "a", "payload": "latency"}`)); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return l, err
	}
	l.offered = float64(total) / time.Since(start).Seconds()
	if err := b.waitDone(ctx, conn, d, v, latencyWarmup+total); err != nil {
		return l, err
	}
	err = l.read(ctx, conn, "status = 'done' AND payload <> 'warm-up'")
	return l, err
}
