// Retries: the answer "75 REASON" (EX_TEMPFAIL) at a stage with RETRY_LIMIT > 0
// pauses its message at the same stage for a doubling, jittered delay.

package core

import (
	"fmt"
	"time"
)

// RetryCode is the status code that asks for a retry (EX_TEMPFAIL of
// sysexits.h: a temporary failure, try again later).
const RetryCode = 75

// RetryJitter is the jitter added to a retry's delay: a fraction drawn
// uniformly from [0, RetryJitter) of the capped delay, so messages that failed
// together do not all come back together. Documented in pepsi.conf(5) as "0 to
// 10 %".
const RetryJitter = 0.1

// RetryDelay is the delay of retry number attempts (0 for the first) at a
// stage, before jitter: delay × 2^attempts, capped at max.
func RetryDelay(delay, max time.Duration, attempts int) time.Duration {
	d := min(delay, max)
	for i := 0; i < attempts && d < max; i++ {
		if d > max/2 {
			return max // the doubling would pass the cap, or an int64's range
		}
		d *= 2
	}
	return d
}

// retry owes what an answer "75 REASON" from worker w means for its head: a
// Retry while it has retries left, its failure with the reason once it has had
// RETRY_LIMIT of them.
func (c *Core) retry(w *worker, head msg, reason string) {
	st := w.stage
	name := st.cfg.Name
	if head.attempts >= st.cfg.RetryLimit {
		c.passEnded(w, head, Pass{Outcome: PassFail, Reason: reason})
		c.owe(Item{ID: head.id, Stage: name, Verdict: Fail, Reason: reason})
		return
	}
	d := RetryDelay(st.cfg.RetryDelay, st.cfg.RetryDelayMax, head.attempts)
	d += time.Duration(float64(d) * RetryJitter * c.random())
	c.passEnded(w, head, Pass{Outcome: PassRetry, Reason: reason})
	c.owe(Item{ID: head.id, Stage: name, Verdict: Retry, Reason: reason, Until: c.now.Add(d)})
}

// random returns the next number in [0, 1) of the core's pseudo-random source
// (SplitMix64, seeded by Start.Seed): deterministic for a given seed, so a
// trace replays.
func (c *Core) random() float64 {
	c.rng += 0x9e3779b97f4a7c15
	z := c.rng
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return float64(z>>11) / (1 << 53)
}

// defaultReason is the reason of a non-zero answer that gave none.
func defaultReason(stage string, code int) string {
	return fmt.Sprintf("stage %s answered %d", stage, code)
}
