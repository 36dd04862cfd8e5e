package fakequeue

import (
	"fmt"
	"hash/fnv"
	"regexp"

	"github.com/pepsi-pipeline/pepsi/core"
)

// Traces, as schema 17 keeps them (store/migrations/0017_traceparent.sql):
// a claim gives a row without a traceparent a fresh one, whose parent span
// is the span of that first pass, and a pass's span id is a hash of the
// row's trace id, id, stage and its version after the claim's write (the
// database hashes the claim's updated_at; the fake's clock may stand still,
// its versions never do). The fresh trace id is the row's id: unique in the
// queue, which is all a fake needs of randomness.

// claimTrace gives r, just written running by a claim, a traceparent if it
// has none. The write's version is the one observe is about to count.
func (q *Queue) claimTrace(r *Row) {
	if r.TraceParent != "" {
		return
	}
	t := fmt.Sprintf("%032x", r.ID)
	r.TraceParent = "00-" + t + "-" + passSpan(t, r.ID, r.Stage, q.versions[r.ID]+1) + "-01"
}

// trace is the trace context a claim of r reads: the message's with all,
// the pass's with all or line (an INPUT = message stage).
func (q *Queue) trace(r *Row, all, line bool) core.Trace {
	var t core.Trace
	if all {
		t.Message = r.TraceParent
	}
	if all || line {
		t.Pass = q.passTrace(r)
	}
	return t
}

// passTrace is the traceparent of the pass r is in, "" when it has none.
func (q *Queue) passTrace(r *Row) string {
	if len(r.TraceParent) != 55 {
		return ""
	}
	return r.TraceParent[:36] + passSpan(r.TraceParent[3:35], r.ID, r.Stage, q.versions[r.ID]) + r.TraceParent[52:]
}

// passSpan is the span id of the pass of message id at stage whose claim
// wrote version.
func passSpan(traceID string, id int64, stage string, version uint32) string {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s:%d:%s:%d", traceID, id, stage, version)
	return fmt.Sprintf("%016x", h.Sum64())
}

// traceCheck is the column's check on insert (queue_traceparent_check: the
// insert trigger of schemas 21 to 25; an UPDATE is not checked since schema
// 27).
var traceCheck = regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)

// checkTraces refuses, as the column's check does, a traceparent ("" for
// none) that is not 00-<32 hex>-<16 hex>-<2 hex>.
func checkTraces(traces []string) error {
	for _, t := range traces {
		if t != "" && !traceCheck.MatchString(t) {
			return fmt.Errorf(`new row for relation "queue" violates check constraint "queue_traceparent_check"`)
		}
	}
	return nil
}
