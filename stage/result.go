package stage

import (
	"fmt"
	"time"
)

// kind is what a Result asks for. The zero kind is deliberately invalid, so a
// handler that returns Result{} is reported instead of silently doing something.
type kind int

const (
	kindInvalid kind = iota
	kindAdvance
	kindDone
	kindFailed
	kindPause
	kindError
	kindRetry
)

// Result is what a Handler decided for its message. Build one with Advance, Done,
// Failed, Pause, PauseFor, Error or Retry; the zero Result is an error ("handler returned
// no Result").
type Result struct {
	kind   kind
	next   string
	until  time.Time
	reason string
}

// Advance moves the message on to stage next: the answer is "0 >next", and the
// dispatcher makes the row pending there. If next is fused into this program
// (Fuse), its handler runs at once, in the same pass. next must be a stage
// name, and not this stage's own.
func Advance(next string) Result { return Result{kind: kindAdvance, next: next} }

// Done finishes the message successfully, "0 >done": it leaves the pipeline.
func Done() Result { return Result{kind: kindDone} }

// Failed finishes the message as failed, because of its content. No answer
// says that, so the library writes it itself (status failed, reason in
// state.error, never in state.dispatch_error, which belongs to the dispatcher)
// and answers a bare "0", since the stage itself did its job.
func Failed(reason string) Result { return Result{kind: kindFailed, reason: reason} }

// Pause parks the message at this stage until the given instant; the dispatcher
// then makes it pending here again, so the handler runs once more. The answer
// carries the time left, "0 >paused:SECONDS" (to the microsecond; 0 for an
// instant already past), which the dispatcher adds to the time it writes the
// row: the message wakes no earlier than until, later by the time the answer
// took to reach that write. until is at most core.PauseMax (10 years) away,
// as the dispatcher takes a pause; a later one fails the message with a
// reason that says so.
func Pause(until time.Time) Result { return Result{kind: kindPause, until: until} }

// PauseFor is Pause(time.Now().Add(d)).
func PauseFor(d time.Duration) Result { return Pause(time.Now().Add(d)) }

// Error reports that the stage could not handle the message: nothing is written,
// the status line is "1 reason", and the dispatcher fails the message with reason
// in state.dispatch_error. Use it for failures of the stage rather than of the
// message (a broken dependency, a bug); use Failed for bad content.
func Error(reason string) Result { return Result{kind: kindError, reason: reason} }

// Retry reports a temporary failure: nothing is written, the status line is
// "75 reason" (EX_TEMPFAIL), and at a stage configured with RETRY_LIMIT > 0
// the dispatcher pauses the message here and runs it again after a doubling
// delay (RETRY_DELAY, RETRY_DELAY_MAX), keeping reason in
// state.dispatch_error meanwhile; the answer that finds the message's retries
// used up fails it with reason. With RETRY_LIMIT = 0 it fails at once, like
// Error. Use it when a service the stage calls is down or throttles it.
func Retry(reason string) Result { return Result{kind: kindRetry, reason: reason} }

// String is the Result in words, for logs and tests: "advance enrich", "done",
// "failed: bad amount", "pause until 2026-01-02T03:04:05Z", "error: no route",
// "retry: service down".
func (r Result) String() string {
	switch r.kind {
	case kindAdvance:
		return "advance " + r.next
	case kindDone:
		return "done"
	case kindFailed:
		return "failed: " + r.reason
	case kindPause:
		return "pause until " + r.until.UTC().Format(time.RFC3339Nano)
	case kindError:
		return "error: " + r.reason
	case kindRetry:
		return "retry: " + r.reason
	}
	return fmt.Sprintf("invalid result (kind %d)", int(r.kind))
}
