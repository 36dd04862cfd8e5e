package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/schollz/progressbar/v3"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/examples/pepsi-example/pipeline"
	"github.com/pepsi-pipeline/pepsi/queueadmin"
)

// stageOrder lists the pipeline's stages in the order messages pass them.
var stageOrder = []string{pipeline.Parse, pipeline.Enrich, pipeline.Tag, pipeline.Deliver, pipeline.Audit}

// progress shows how far the pipeline is: a bar refreshed in place on a
// terminal, a plain line per poll otherwise.
type progress struct {
	w    io.Writer
	n    int
	bar  *progressbar.ProgressBar // nil when not a terminal
	gate *gate                    // between bar and w
}

func newProgress(w io.Writer, n int, tty bool) *progress {
	p := &progress{w: w, n: n}
	if tty {
		p.gate = &gate{w: w}
		p.bar = progressbar.NewOptions64(int64(n),
			progressbar.OptionSetWriter(p.gate),
			progressbar.OptionSetWidth(30),
			progressbar.OptionShowCount(),
			progressbar.OptionSetPredictTime(false),
			progressbar.OptionSetElapsedTime(true),
			progressbar.OptionShowDescriptionAtLineEnd(),
			// No throttle: a throttled render is dropped, and show's second
			// one, the count, was, leaving the count of an earlier poll beside
			// this poll's text. Polls are pollTTY apart.
			progressbar.OptionSetRenderBlankState(true))
	}
	return p
}

// gate passes the bar's output on to w unless muted. The bar renders on each
// of Describe and Set64: show mutes the first, so that the terminal never shows
// this poll's text beside the last poll's count.
type gate struct {
	w     io.Writer
	muted bool
}

func (g *gate) Write(b []byte) (int, error) {
	if g.muted {
		return len(b), nil
	}
	return g.w.Write(b)
}

// show reports one snapshot: finished messages, and where the rest are.
func (p *progress) show(s *queueadmin.Stats, finished int64, elapsed time.Duration) {
	where := map[string]int64{}
	var paused int64
	for _, d := range s.Depth {
		switch d.Status {
		case core.StatusPending, core.StatusRunning:
			where[d.Stage] += d.Count
		case core.StatusPaused:
			paused += d.Count
		}
	}
	var parts []string
	for _, st := range stageOrder {
		if where[st] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", st, where[st]))
		}
	}
	if paused > 0 {
		parts = append(parts, fmt.Sprintf("paused %d", paused))
	}
	inFlight := "in flight: none"
	if len(parts) > 0 {
		inFlight = "in flight: " + strings.Join(parts, ", ")
	}
	if p.bar != nil {
		// The count is done + failed + timeout: name all three, or they do not add up.
		ended := fmt.Sprintf("done %d, failed %d", s.Count("done"), s.Count("failed"))
		if n := s.Count("timeout"); n > 0 {
			ended += fmt.Sprintf(", timeout %d", n)
		}
		p.gate.muted = true
		p.bar.Describe(ended + " | " + inFlight)
		p.gate.muted = false
		_ = p.bar.Set64(finished) // renders both; to a terminal it cannot usefully fail
		return
	}
	fmt.Fprintf(p.w, "[%6.1fs] %d/%d finished (done %d, failed %d, timeout %d) | %s\n",
		elapsed.Seconds(), finished, p.n, s.Count("done"), s.Count("failed"), s.Count("timeout"), inFlight)
}

func (p *progress) finish() {
	if p.bar != nil {
		_ = p.bar.Exit()
		fmt.Fprintln(p.w)
	}
}

// summary prints the outcome, the time it took, and pepsi-queue stats.
func (d *demo) summary(ctx context.Context, conn *pgx.Conn, elapsed time.Duration) error {
	s, err := queueadmin.ReadStats(ctx, conn)
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "%d messages: %d done, %d failed, %d timeout\n", d.n, s.Count("done"), s.Count("failed"), s.Count("timeout"))
	fmt.Fprintf(d.out, "%s from the first enqueue to the last message leaving the pipeline: %.0f messages/s, %.0f stage passes/s\n",
		elapsed.Round(time.Millisecond), float64(d.n)/elapsed.Seconds(), float64(s.Dispatch.StagePasses)/elapsed.Seconds())
	return d.tool(ctx, nil, "stats")
}

// checks compares the end state with what the pipeline's rules predict.
func (d *demo) checks(ctx context.Context, conn *pgx.Conn, want pipeline.Expectation) error {
	var done, failed, other, pausedOnce, audited, failedByParse, dispatchErrors int
	err := conn.QueryRow(ctx, `SELECT
	count(*) FILTER (WHERE status = 'done'),
	count(*) FILTER (WHERE status = 'failed'),
	count(*) FILTER (WHERE status NOT IN ('done', 'failed')),
	count(*) FILTER (WHERE status = 'done' AND state->>'deliver_attempts' = '2'),
	count(*) FILTER (WHERE status = 'done' AND state->>'audited_by' = 'audit.sh' AND state ? 'delivered' AND state ? 'tags'),
	count(*) FILTER (WHERE status = 'failed' AND stage = 'parse' AND state ? 'error'),
	count(*) FILTER (WHERE state ? 'dispatch_error')
FROM pepsi.queue`).Scan(&done, &failed, &other, &pausedOnce, &audited, &failedByParse, &dispatchErrors)
	if err != nil {
		return fmt.Errorf("checks: %w", err)
	}
	d.check(done == want.Done, "done: %d (predicted %d)", done, want.Done)
	d.check(failed == want.Failed, "failed: %d (predicted %d: payloads whose amount is not a number)", failed, want.Failed)
	d.check(other == 0, "neither done nor failed: %d (predicted 0)", other)
	d.check(failedByParse == failed, "failed by parse itself, with state.error: %d of %d", failedByParse, failed)
	d.check(dispatchErrors == 0, "failed by the dispatcher (state.dispatch_error): %d (predicted 0)", dispatchErrors)
	d.check(pausedOnce == want.Paused, "paused once by deliver, then delivered: %d (predicted %d)", pausedOnce, want.Paused)
	d.check(audited == done, "done messages enriched, tagged, delivered and audited by audit.sh: %d of %d", audited, done)

	// The failed ones must be exactly the predicted payloads.
	rows, err := conn.Query(ctx, `SELECT payload FROM pepsi.queue WHERE status = 'failed'`)
	if err != nil {
		return fmt.Errorf("checks: %w", err)
	}
	payloads, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		return fmt.Errorf("checks: %w", err)
	}
	wrong := 0
	for _, p := range payloads {
		if _, err := pipeline.ParseOrder(p); err == nil {
			wrong++
		}
	}
	d.check(wrong == 0, "failed messages whose payload parses (so should not have failed): %d", wrong)

	// The dispatcher's statistics: each stage pass counted once, credited to its
	// own stage (tag's through enrich's status lines).
	s, err := queueadmin.ReadStats(ctx, conn)
	if err != nil {
		return err
	}
	good := int64(want.Done)
	processed := map[string]int64{
		pipeline.Parse:   int64(d.n),
		pipeline.Enrich:  good,
		pipeline.Tag:     good,
		pipeline.Deliver: good + int64(want.Paused),
		pipeline.Audit:   good,
	}
	got := map[string]queueadmin.StageStats{}
	for _, st := range s.Stages {
		got[st.Stage] = st
	}
	var passes int64
	for _, name := range stageOrder {
		st := got[name]
		passes += processed[name]
		d.check(st.Processed == processed[name] && st.Failed == 0 && st.Timeouts == 0 && st.Crashes == 0,
			"stage_stats %s: processed %d, failed %d, timeouts %d, crashes %d (predicted %d, 0, 0, 0)",
			name, st.Processed, st.Failed, st.Timeouts, st.Crashes, processed[name])
	}
	d.check(s.Dispatch.StagePasses == passes && s.Dispatch.MessagesLeft == int64(d.n),
		"dispatch_stats: %d stage passes, %d messages left (predicted %d, %d)", s.Dispatch.StagePasses, s.Dispatch.MessagesLeft, passes, d.n)
	return nil
}
