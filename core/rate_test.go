package core_test

import (
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
)

// Proves: a stage's RATE caps its claims (a bucket of max(1, RATE − 1) tokens,
// one more every 1/RATE s) whatever its capacity and backlog; the rows beyond stay
// pending; the core asks for a tick when the next token is due and claims then,
// without polling in between; the time the stage was held counts in its
// statistics.
func TestRateCapsClaimsAndWakesWhenTheNextTokenIsDue(t *testing.T) {
	w := newWorld(t, `
[pepsi-dispatch]
POLL_INTERVAL = 1h
[stage-a]
PROGRAM = a
RATE = 2
PARALLELISM = 4
QUEUE_LIMIT = 16
`)
	w.q.Insert("a", 40)
	var claims []struct {
		at time.Duration
		n  int
	}
	note := func(cmds []core.Command) {
		for _, c := range of[core.Claim](cmds) {
			for _, cp := range c.Caps {
				claims = append(claims, struct {
					at time.Duration
					n  int
				}{w.now.Sub(epoch), cp.N})
			}
		}
	}
	cmds := w.step(core.Start{})
	note(cmds)
	steps := 0
	for w.now.Sub(epoch) < 5*time.Second {
		at := lastTimer(t, w.all)
		if !at.After(w.now) {
			t.Fatalf("timer at %s, not after now %s: the core would spin", at.Sub(epoch), w.now.Sub(epoch))
		}
		note(w.tick(at.Sub(epoch)))
		steps++
	}
	total := 0
	for i, c := range claims {
		total += c.n
		sum := 0
		for _, d := range claims[i:] {
			sum += d.n
			if limit := 2*(d.at-c.at).Seconds() + 2; float64(sum) > limit+1e-9 {
				t.Fatalf("%d claimed in [%s, %s], more than RATE × T + max(1, RATE) = %.2f", sum, c.at, d.at, limit)
			}
		}
	}
	// The bucket starts empty (a restart must not claim a second burst), so
	// one every 0.5 s from 0.5 s on: 10 in [0, 5 s], each claimed when its
	// token came, never before.
	if total != 10 || claims[0].at != 500*time.Millisecond {
		t.Errorf("claimed %d rows in 5 s at RATE 2, want 10, one every 0.5 s from 0.5 s on: %v", total, claims)
	}
	if steps > 30 {
		t.Errorf("%d steps for 10 tokens: the core polls", steps)
	}
	pending := 0
	for _, r := range w.q.Rows() {
		if r.Status == core.StatusPending {
			pending++
		}
	}
	if pending != 40-total {
		t.Errorf("%d rows pending, want %d", pending, 40-total)
	}
	w.tick(70 * time.Second) // STATS_INTERVAL
	var held int64
	for _, f := range of[core.Flush](w.all) {
		for _, d := range f.Stages {
			held += d.RateHeldUS
		}
	}
	if held < (4 * time.Second).Microseconds() {
		t.Errorf("flushed rate-held time %d µs, want most of the 5 s the stage waited for tokens", held)
	}
}

func TestRateBucketSizes(t *testing.T) {
	for _, c := range []struct {
		rate            float64
		interval, burst time.Duration
	}{
		{50, 20 * time.Millisecond, 980 * time.Millisecond},
		{0.5, 2 * time.Second, 2 * time.Second},
		{1.5, 666666667 * time.Nanosecond, 666666667 * time.Nanosecond},
		{3, 333333334 * time.Nanosecond, 666666668 * time.Nanosecond},
	} {
		if i, b := core.RateInterval(c.rate), core.RateBurst(c.rate); i != c.interval || b != c.burst {
			t.Errorf("RATE %g: interval %s burst %s, want %s and %s", c.rate, i, b, c.interval, c.burst)
		}
	}
}
