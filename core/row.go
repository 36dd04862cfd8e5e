package core

// RowStatus is the status column of a pepsi.queue row (docs/protocol.md, "The
// queue and who writes what"). Its values are the column's CHECK constraint;
// the text form is what the database stores.
type RowStatus string

// The statuses a row can have.
const (
	// StatusPending: waiting for the dispatcher's claim at its stage.
	StatusPending RowStatus = "pending"
	// StatusRunning: claimed; a worker of its stage holds it (or did, before a
	// crash the start-up reset repairs).
	StatusRunning RowStatus = "running"
	// StatusPaused: waiting for its timeout, then pending again at its stage.
	StatusPaused RowStatus = "paused"
	// StatusBlocked: waiting behind an older unfinished message of its
	// order key; the release that ends that message's turn makes it its key's
	// head (docs/protocol.md, "Ordering per key").
	StatusBlocked RowStatus = "blocked"
	// StatusDone: finished.
	StatusDone RowStatus = "done"
	// StatusFailed: failed by its stage or by the dispatcher (state.dispatch_error).
	StatusFailed RowStatus = "failed"
	// StatusTimeout: its head-of-line pass outlived MAX_RUNTIME.
	StatusTimeout RowStatus = "timeout"
)

// RowStatuses lists every status a row can have, in pipeline order: the order
// the tools list them in.
func RowStatuses() []RowStatus {
	return []RowStatus{StatusPending, StatusRunning, StatusPaused, StatusBlocked, StatusDone, StatusFailed, StatusTimeout}
}

// Final reports whether a row with status s has left the pipeline.
func (s RowStatus) Final() bool {
	return s == StatusDone || s == StatusFailed || s == StatusTimeout
}
