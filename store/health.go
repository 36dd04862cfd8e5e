package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/core"
)

// The statements of pepsi.stage_health (schema version 13): the dispatcher
// records its core's verdict on each stage (core.Health), pepsi-httpd and
// pepsi-queue stats read it.

// writeHealthSQL replaces the stage_health rows by the stages $1 with states
// $2, reasons $3 and cooldown ends $4 (NULL for none): the rows of other
// stages go (a dispatcher records its own stages only), and a stage whose
// state did not change keeps its since.
const writeHealthSQL = `WITH h AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[]) AS h(stage, state, reason, until)
), gone AS (
	DELETE FROM pepsi.stage_health WHERE stage <> ALL ($1::text[])
)
INSERT INTO pepsi.stage_health AS s (stage, state, reason, until, since, updated_at)
SELECT stage, state, reason, until, now(), now() FROM h
ON CONFLICT (stage) DO UPDATE SET
	state = EXCLUDED.state, reason = EXCLUDED.reason, until = EXCLUDED.until,
	since = CASE WHEN s.state = EXCLUDED.state THEN s.since ELSE EXCLUDED.since END,
	updated_at = EXCLUDED.updated_at`

// healthSQL reads the stage_health rows, by stage.
const healthSQL = `SELECT stage, state, reason, until, since, updated_at FROM pepsi.stage_health ORDER BY stage`

// WriteHealth records hs, one entry per stage of the dispatcher, as the
// stage_health rows.
func (s *PG) WriteHealth(ctx context.Context, hs []core.StageHealth) error {
	n := len(hs)
	stages, states, reasons, untils := make([]string, n), make([]string, n), make([]string, n), make([]*time.Time, n)
	for i, h := range hs {
		// A reason may quote what the configuration named (a program path
		// in another encoding): one text the database refuses would keep
		// every stage's health from being recorded.
		stages[i], states[i], reasons[i] = h.Stage, string(h.State), core.StorableText(h.Reason)
		if !h.Until.IsZero() {
			untils[i] = &hs[i].Until
		}
	}
	if _, err := s.db.Exec(ctx, writeHealthSQL, stages, states, reasons, untils); err != nil {
		return fmt.Errorf("record stage health: %w", err)
	}
	return nil
}

// StageHealth is one row of pepsi.stage_health: what the dispatcher last
// recorded of a stage's workers.
type StageHealth struct {
	Stage  string
	State  core.HealthState
	Reason string
	// Until, for core.HealthCannotStart, is when the spawn cooldown ends
	// (zero for none).
	Until time.Time
	// Since is when the stage entered State; UpdatedAt when the dispatcher
	// last recorded it.
	Since, UpdatedAt time.Time
}

// Health is what the dispatcher recorded of every stage, and whether it is
// current.
type Health struct {
	Stages []StageHealth
	// Current says a dispatcher holds the lock: the rows are its own.
	// Without one they are what the last dispatcher left.
	Current bool
	// Now is the server's clock at the read, to measure Since and Until by.
	Now time.Time
}

// ReadHealth reads pepsi.stage_health and whether a dispatcher holds the
// lock; in a REPEATABLE READ transaction, of one instant.
func (s *PG) ReadHealth(ctx context.Context) (Health, error) {
	var h Health
	var err error
	if h.Now, h.Current, err = s.MonitorLock(ctx); err != nil {
		return Health{}, err
	}
	if h.Stages, err = s.ReadStageHealth(ctx); err != nil {
		return Health{}, err
	}
	return h, nil
}

// ReadStageHealth reads the rows of pepsi.stage_health, by stage.
func (s *PG) ReadStageHealth(ctx context.Context) ([]StageHealth, error) {
	return collect(ctx, s.db, "read stage_health", func(r pgx.CollectableRow) (StageHealth, error) {
		var st StageHealth
		var until *time.Time
		err := r.Scan(&st.Stage, &st.State, &st.Reason, &until, &st.Since, &st.UpdatedAt)
		if until != nil {
			st.Until = *until
		}
		return st, err
	}, healthSQL)
}

// StageHealthVersion is the schema version that made pepsi.stage_health
// and ready_at.
const StageHealthVersion = 13

// StageHealthExists says whether pepsi.stage_health (schema version 13)
// exists: pepsi-httpd reads it, and ready_at beside it.
func (s *PG) StageHealthExists(ctx context.Context) (bool, error) {
	return s.relationExists(ctx, "pepsi.stage_health")
}
