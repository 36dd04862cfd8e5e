// Rates: a stage's RATE caps how many messages per second are claimed for it,
// with a token bucket on the core's clock.

package core

import (
	"math"
	"time"
)

// bucket is a stage's RATE as a token bucket, kept as the instant it would be
// full again (the generic cell rate algorithm): one token every interval, at
// most burst's worth of them. A claim of n takes n tokens when it is sent; when
// its result comes, it is counted again as if it had been made then, of the
// rows it got (all n if the result was lost). So in any T seconds at most
// T/interval + burst/interval ≤ RATE × T + max(1, RATE − 1) messages are
// claimed, however PostgreSQL times each claim between the core's decision and
// its result (a claim's transaction runs a little after the core decided it,
// and that delay differs from one transaction to the next): the documented
// bound, RATE × T + max(1, RATE), with a message to spare from a RATE of 2 up.
type bucket struct {
	interval time.Duration // one token: ⌈1e9/RATE⌉ ns, so tokens never come faster than RATE
	burst    time.Duration // the bucket's size as time: ⌊max(1, RATE − 1) × interval⌋
	full     time.Time     // when the bucket is full again; the zero time: full now
	before   time.Time     // full before the outstanding claim took its tokens
	// heldSince: since when (at the latest step) the stage has been held by
	// its rate: work to claim, room for it, and no token.
	heldSince time.Time
}

// RateInterval and RateBurst are a RATE's bucket as the core keeps it: a token
// every RateInterval, at most RateBurst's worth of tokens (see pepsi.conf(5)).
func RateInterval(rate float64) time.Duration {
	return max(time.Duration(math.Ceil(1e9/rate)), 1)
}

// RateBurst: see RateInterval. The bucket holds max(1, RATE − 1) tokens, one
// below the bound's max(1, RATE) (see bucket).
func RateBurst(rate float64) time.Duration {
	return time.Duration(math.Floor(max(1, rate-1) * float64(RateInterval(rate))))
}

// newBucket returns the bucket of a RATE, or nil for none (0).
func newBucket(rate float64) *bucket {
	if rate <= 0 {
		return nil
	}
	return &bucket{interval: RateInterval(rate), burst: RateBurst(rate)}
}

// empty spends every token at now: a core starts with its buckets empty.
func (b *bucket) empty(now time.Time) {
	if b != nil {
		b.full = now.Add(b.burst)
	}
}

// tokens is how many messages may be claimed at now; without a rate, any number.
func (b *bucket) tokens(now time.Time) int {
	if b == nil {
		return math.MaxInt
	}
	debt := max(b.full.Sub(now), 0)
	if b.full.IsZero() {
		debt = 0
	}
	return int(max(b.burst-debt, 0) / b.interval)
}

// take spends n tokens at now.
func (b *bucket) take(now time.Time, n int) {
	if b == nil || n <= 0 {
		return
	}
	b.before = b.full
	b.full = later(b.full, now).Add(time.Duration(n) * b.interval)
}

// settle counts the outstanding claim again, as one of got rows made at at,
// its result's instant (see bucket).
func (b *bucket) settle(at time.Time, got int) {
	if b == nil {
		return
	}
	b.full = later(b.before, at).Add(time.Duration(got) * b.interval)
}

func later(a, b time.Time) time.Time {
	if a.Before(b) {
		return b
	}
	return a
}

// nextToken is when the bucket next holds a whole token.
func (b *bucket) nextToken() time.Time {
	return b.full.Add(b.interval - b.burst)
}

// rateHeld reports whether st is held back by its rate at now: it may have rows
// to claim and room for them, but no token.
func (c *Core) rateHeld(st *stage) bool {
	return st.rate != nil && c.shutdown == 0 && st.maybeMore && c.capacity(st) > 0 && st.rate.tokens(c.now) == 0 && c.heldBy(st) == nil
}

// countRateHeld adds the time since the last step to the stages that were held
// by their rate at its end. It runs before the step decides what to flush, so
// the time counted is flushed by the same rules as every other count (counted
// after, it could make an idle flush due in the past, with no timer to come).
func (c *Core) countRateHeld() {
	for _, st := range c.stages {
		if b := st.rate; b != nil && !b.heldSince.IsZero() {
			if us := c.now.Sub(b.heldSince).Microseconds(); us > 0 {
				c.stat(st.cfg.Name).RateHeldUS += us
			}
			b.heldSince = c.now
		}
	}
}

// markRateHeld notes, at the end of a step, which stages are held by their
// rate, for the next step's countRateHeld.
func (c *Core) markRateHeld() {
	for _, st := range c.stages {
		if b := st.rate; b != nil {
			switch {
			case !c.rateHeld(st):
				b.heldSince = time.Time{}
			case b.heldSince.IsZero() && st.claiming > 0:
				// Its tokens went to its own claim, out now: it waits for
				// that claim's result, not for a token (a stage with no
				// rows at all, claimed at a notification, is not held).
				// Once held, an outstanding claim does not end it.
			case b.heldSince.IsZero():
				b.heldSince = c.now
			}
		}
	}
}
