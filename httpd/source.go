package httpd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/singleflight"

	"github.com/pepsi-pipeline/pepsi/internal/pgaddr"
	"github.com/pepsi-pipeline/pepsi/store"
)

// Options configure a Source.
type Options struct {
	// Database is a libpq URL or key=value string; empty means the PG* environment.
	Database string
	// Stages are listed even before the database knows them (the configuration's).
	Stages []string
	// StatementTimeout bounds every statement of a read on the server
	// (statement_timeout); a read that would take longer fails instead.
	StatementTimeout time.Duration
	// CacheMaxAge is how long a read answers later requests: scrapes and page
	// polls within it share one read.
	CacheMaxAge time.Duration
	// SampleInterval is how often the history behind the page's charts takes a
	// sample; HistoryMax bounds how many it keeps.
	SampleInterval time.Duration
	HistoryMax     int
	// Log receives read failures and recoveries.
	Log *slog.Logger
	// Hosts are the host names, besides IP addresses, localhost and names
	// under .localhost, that the page and its API answer to (the Host a
	// browser sends); "*" answers to any. See hostGuard.
	Hosts []string
}

// Defaults for Options' zero fields.
const (
	StatementTimeoutDefault = 5 * time.Second
	CacheMaxAgeDefault      = time.Second
	SampleIntervalDefault   = 5 * time.Second
	HistoryMaxDefault       = 180 // 15 minutes at 5 s
	// poolConnsMax bounds the database connections of one pepsi-httpd: the
	// snapshot's read (one at a time), a message page's read (one at a time:
	// Source.pages), and one left for /healthz, which must answer while the
	// others wait on a lock.
	poolConnsMax = 3
)

// Source reads Snapshots for all the handlers: one read at a time, shared by
// every request that arrives while it runs or within CacheMaxAge after it.
type Source struct {
	pool  *pgxpool.Pool
	opts  Options
	where string // the database, for errors
	// schemaOK: the schema check passed once (see firstRead).
	schemaOK atomic.Bool
	log      *slog.Logger
	sf       singleflight.Group
	// pages lets one message page's read at a time hold a connection:
	// however many requests for pages come, /healthz keeps one.
	pages chan struct{}

	mu      sync.Mutex
	last    *Snapshot // the latest successful read
	lastAt  time.Time // when the latest read (good or bad) finished, local clock
	lastErr error     // the latest read's error, nil if it succeeded
	reads   int64     // reads done, for tests
	history []Sample  // oldest first, at most opts.HistoryMax
}

// Sample is one point of the page's charts.
type Sample struct {
	At time.Time `json:"at"`
	// Stages maps a stage to its numbers at At: pending, running, paused,
	// failed, timeout (live counts) and passes_ok, failed_by_dispatcher (the
	// dispatcher's counters, which move when it flushes).
	Stages map[string]map[string]int64 `json:"stages"`
}

// Open connects to the database and makes one read, so that a wrong URL or a
// missing schema is reported at start. A database it cannot read is not an
// error: the Source starts with that failure as its latest read, and reads
// again when asked (see Snapshot) until it succeeds. The pool it opens is
// closed by Close.
func Open(ctx context.Context, opts Options) (*Source, error) {
	if opts.StatementTimeout <= 0 {
		opts.StatementTimeout = StatementTimeoutDefault
	}
	if opts.CacheMaxAge <= 0 {
		opts.CacheMaxAge = CacheMaxAgeDefault
	}
	if opts.SampleInterval <= 0 {
		opts.SampleInterval = SampleIntervalDefault
	}
	if opts.HistoryMax <= 0 {
		opts.HistoryMax = HistoryMaxDefault
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	cfg, err := pgxpool.ParseConfig(opts.Database)
	if err != nil {
		return nil, fmt.Errorf("database connection string: %w", err)
	}
	cfg.MaxConns = poolConnsMax
	cc := cfg.ConnConfig
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = 10 * time.Second
	}
	if cc.RuntimeParams["application_name"] == "" {
		cc.RuntimeParams["application_name"] = "pepsi-httpd"
	}
	cc.RuntimeParams["statement_timeout"] = fmt.Sprint(opts.StatementTimeout.Milliseconds())
	cc.RuntimeParams["default_transaction_read_only"] = "on"
	cfg.AfterConnect = utcTimes
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	s := &Source{pool: pool, opts: opts, log: opts.Log, pages: make(chan struct{}, 1),
		where: pgaddr.Where(&cc.Config)}
	snap, err := s.firstRead(ctx)
	if errors.Is(err, errNoSchema) {
		pool.Close()
		return nil, err
	}
	s.lastAt, s.reads = time.Now(), 1
	if err != nil {
		// Under a supervisor, exiting would be a crash loop until the database
		// comes; serving says it is down (pepsi_database_up 0, a 503 /healthz),
		// and every later read tries again.
		s.lastErr = err
		s.log.Error("cannot read the database at start; serving pepsi_database_up 0 and a 503 /healthz until it answers", "err", err)
		return s, nil
	}
	s.last = snap
	return s, nil
}

// errNoSchema: the database answers but has no PEPSI schema pepsi-httpd can read.
var errNoSchema = fmt.Errorf("no PEPSI schema of version %d or later (index pepsi.queue_failed or table pepsi.stage_health is missing): run pepsi-queue migrate",
	store.StageHealthVersion)

// firstRead checks the schema, then reads, until both have once succeeded.
// Without the index of schema version 2, counting failed messages would scan the
// queue at every scrape; without version 13 there is no stage health to read.
func (s *Source) firstRead(ctx context.Context) (*Snapshot, error) {
	if !s.schemaOK.Load() {
		q := store.On(s.pool)
		indexed, err := q.FailedIndexExists(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.where, err)
		}
		health, err := q.StageHealthExists(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.where, err)
		}
		if !indexed || !health {
			return nil, fmt.Errorf("%s: %w", s.where, errNoSchema)
		}
		s.schemaOK.Store(true)
	}
	snap, err := Read(ctx, s.pool, s.opts.Stages)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.where, err)
	}
	return snap, nil
}

// Message reads message id for the message page (store.ReadPageMessage),
// on the read-only pool, or returns store.ErrNotFound.
func (s *Source) Message(ctx context.Context, id int64) (store.PageMessage, error) {
	return onPage(ctx, s, func(pg *store.PG) (store.PageMessage, error) { return pg.ReadPageMessage(ctx, id) })
}

// onPage runs read on the message pages' one connection (Source.pages),
// waiting for it while another message page's read holds it.
func onPage[T any](ctx context.Context, s *Source, read func(*store.PG) (T, error)) (T, error) {
	select {
	case s.pages <- struct{}{}:
	case <-ctx.Done():
		var none T
		return none, fmt.Errorf("database: waiting for another message page's read: %w", ctx.Err())
	}
	defer func() { <-s.pages }()
	return read(store.On(s.pool))
}

// PayloadSize reads message id's payload size in bytes (nil for none), on
// the read-only pool, through pepsi.payload_size: the monitoring role reads
// no payload.
func (s *Source) PayloadSize(ctx context.Context, id int64) (*int64, error) {
	return onPage(ctx, s, func(pg *store.PG) (*int64, error) { return pg.PayloadSize(ctx, id) })
}

// MessageHistory reads message id's latest store.HistoryLatestMax events
// (pepsi.history), oldest first, and says whether it has older ones.
func (s *Source) MessageHistory(ctx context.Context, id int64) ([]store.HistoryRow, bool, error) {
	var older bool
	rows, err := onPage(ctx, s, func(pg *store.PG) ([]store.HistoryRow, error) {
		rows, o, err := pg.HistoryLatest(ctx, id, store.HistoryLatestMax)
		older = o
		return rows, err
	})
	return rows, older, err
}

// Close closes the database connections.
func (s *Source) Close() { s.pool.Close() }

// Snapshot returns a read no older than CacheMaxAge, making one if needed.
// Callers that arrive while a read runs wait for it and share its result; the
// read itself is not cancelled when one of them gives up. On failure it returns
// the error (the last good Snapshot is in Last).
func (s *Source) Snapshot(ctx context.Context) (*Snapshot, error) {
	s.mu.Lock()
	if !s.lastAt.IsZero() && time.Since(s.lastAt) < s.opts.CacheMaxAge {
		snap, err := s.last, s.lastErr
		s.mu.Unlock()
		if err != nil {
			return nil, err
		}
		return snap, nil
	}
	s.mu.Unlock()
	ch := s.sf.DoChan("read", func() (any, error) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.StatementTimeout+5*time.Second)
		defer cancel()
		return s.read(rctx)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		return r.Val.(*Snapshot), nil
	case <-ctx.Done():
		return nil, fmt.Errorf("read the pipeline's state: %w", ctx.Err())
	}
}

// read makes one Snapshot and records it (or its failure).
func (s *Source) read(ctx context.Context) (*Snapshot, error) {
	snap, err := s.firstRead(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	s.lastAt = time.Now()
	if err != nil {
		if s.lastErr == nil {
			s.log.Error("cannot read the database", "err", err)
		}
		s.lastErr = err
		return nil, err
	}
	if s.lastErr != nil {
		s.log.Info("reading the database again")
	}
	s.last, s.lastErr = snap, nil
	return snap, nil
}

// Last returns the latest good Snapshot (nil before the first) and the error of
// the latest read (nil if it succeeded).
func (s *Source) Last() (*Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last, s.lastErr
}

// Reads returns how many database reads the Source has made.
func (s *Source) Reads() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads
}

// Ping asks the database to answer within timeout.
func (s *Source) Ping(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	return nil
}

// History returns the samples kept for the charts, oldest first.
func (s *Source) History() []Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Sample(nil), s.history...)
}

// Sample runs until ctx ends, taking a sample for the charts every
// SampleInterval (through Snapshot, so it shares reads with the scrapes). A
// failed read adds no sample.
func (s *Source) Sample(ctx context.Context) {
	t := time.NewTicker(s.opts.SampleInterval)
	defer t.Stop()
	for {
		if snap, err := s.Snapshot(ctx); err == nil {
			s.add(snap)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Source) add(snap *Snapshot) {
	p := Sample{At: snap.At, Stages: map[string]map[string]int64{}}
	for _, l := range snap.Live {
		m := map[string]int64{}
		for k, v := range l.Messages {
			m[string(k)] = v
		}
		p.Stages[l.Stage] = m
	}
	for _, st := range snap.Stages {
		p.Stages[st.Stage]["passes_ok"] = st.PassesOK
		p.Stages[st.Stage]["failed_by_dispatcher"] = st.FailedByDispatcher
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.history); n > 0 && !s.history[n-1].At.Before(p.At) {
		return // the same read again
	}
	s.history = append(s.history, p)
	if len(s.history) > s.opts.HistoryMax {
		s.history = slices.Delete(s.history, 0, len(s.history)-s.opts.HistoryMax)
	}
}

// utcTimes makes a connection scan timestamptz values in UTC, not in the
// zone pepsi-httpd runs in: JSON's times end at the year 9999, and a time
// the database holds (a not_before up to 9999-12-31T23:59:59Z in UTC, as the
// producers accept it) falls in the year 10000 east of UTC, which
// encoding/json refuses.
func utcTimes(_ context.Context, conn *pgx.Conn) error {
	conn.TypeMap().RegisterType(&pgtype.Type{Name: "timestamptz", OID: pgtype.TimestamptzOID,
		Codec: &pgtype.TimestamptzCodec{ScanLocation: time.UTC}})
	return nil
}
