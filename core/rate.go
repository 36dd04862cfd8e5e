// Rates: a stage's RATE caps how many messages per second are claimed for it,
// with a token bucket on the core's clock.

package core

import (
	"math"
	"time"
)

// bucket is a stage's RATE as a token bucket, kept as the instant it would be
// full again (the generic cell rate algorithm): one token every Interval, at
// most Burst's worth of them. A claim of n takes n tokens when it is sent;
// rows it did not get are given back when its result comes. So in any T
// seconds at most T/Interval + Burst/Interval ≤ RATE × T + max(1, RATE)
// messages are claimed.
type bucket struct {
	interval time.Duration // one token: ⌈1e9/RATE⌉ ns, so tokens never come faster than RATE
	burst    time.Duration // the bucket's size as time: ⌊max(1, RATE) × interval⌋
	full     time.Time     // when the bucket is full again; the zero time: full now
	// heldSince: since when (at the latest step) the stage has been held by
	// its rate: work to claim, room for it, and no token.
	heldSince time.Time
}

// RateInterval and RateBurst are a RATE's bucket as the core keeps it: a token
// every RateInterval, at most RateBurst's worth of tokens (see pepsi.conf(5)).
func RateInterval(rate float64) time.Duration {
	return max(time.Duration(math.Ceil(1e9/rate)), 1)
}

// RateBurst: see RateInterval.
func RateBurst(rate float64) time.Duration {
	return time.Duration(math.Floor(max(1, rate) * float64(RateInterval(rate))))
}

// newBucket returns the bucket of a RATE, or nil for none (0).
func newBucket(rate float64) *bucket {
	if rate <= 0 {
		return nil
	}
	return &bucket{interval: RateInterval(rate), burst: RateBurst(rate)}
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
	if b.full.Before(now) {
		b.full = now
	}
	b.full = b.full.Add(time.Duration(n) * b.interval)
}

// giveBack returns n tokens a claim did not use: as if it had asked for fewer.
func (b *bucket) giveBack(n int) {
	if b == nil || n <= 0 {
		return
	}
	b.full = b.full.Add(-time.Duration(n) * b.interval)
}

// nextToken is when the bucket next holds a whole token.
func (b *bucket) nextToken() time.Time {
	return b.full.Add(b.interval - b.burst)
}

// rateHeld reports whether st is held back by its rate at now: it may have rows
// to claim and room for them, but no token.
func (c *Core) rateHeld(st *stage) bool {
	return st.rate != nil && c.shutdown == 0 && st.maybeMore && c.capacity(st) > 0 && st.rate.tokens(c.now) == 0
}

// countRateHeld adds the time since the last step to the stages that were held
// by their rate, and notes which are held now.
func (c *Core) countRateHeld() {
	for _, st := range c.stages {
		b := st.rate
		if b == nil {
			continue
		}
		if !b.heldSince.IsZero() {
			if us := c.now.Sub(b.heldSince).Microseconds(); us > 0 {
				c.stat(st.cfg.Name).RateHeldUS += us
			}
			b.heldSince = time.Time{}
		}
		if c.rateHeld(st) {
			b.heldSince = c.now
		}
	}
}
