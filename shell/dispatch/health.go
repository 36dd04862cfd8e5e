package dispatch

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// healthRetry is the pause before a failed stage_health write is tried
// again (the database is down, or the write timed out), unless a newer
// verdict comes first; healthTimeout bounds one write.
const (
	healthRetry   = time.Second
	healthTimeout = 10 * time.Second
)

// recordHealth hands the core's verdict on its stages (core.Health) to the
// health writer when it differs from the last one handed, replacing one the
// writer has not taken yet: only the latest matters. The first step of a
// session always hands one, so a new dispatcher replaces what the last left.
func (s *session) recordHealth() {
	h := s.core.Health()
	if s.health != nil && slices.Equal(h, s.health) {
		return
	}
	s.health = h
	select {
	case <-s.healthOut:
	default:
	}
	s.healthOut <- h // the loop is the only sender, and the mailbox is now empty
}

// writeHealth writes each verdict it takes from in to pepsi.stage_health
// (store.WriteHealth), off the loop, until ctx ends. A write that fails is
// tried again after healthRetry, unless a newer verdict has come; the first
// failure of a run of them is logged, at warn: what the page shows of the
// stages is then behind, nothing else is.
func writeHealth(ctx context.Context, q *store.Queue, log *slog.Logger, in <-chan []core.StageHealth) {
	var h []core.StageHealth
	var retry <-chan time.Time
	failing := false
	for {
		select {
		case h = <-in:
		case <-retry:
		case <-ctx.Done():
			return
		}
		retry = nil
		wctx, cancel := context.WithTimeout(ctx, healthTimeout)
		err := q.WriteHealth(wctx, h)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			if !failing {
				log.Warn("cannot record the stages' health for pepsi-httpd and pepsi-queue stats; retrying", "err", err)
			}
			failing = true
			retry = time.After(healthRetry)
		case err == nil && failing:
			log.Info("recorded the stages' health again")
			failing = false
		}
	}
}
