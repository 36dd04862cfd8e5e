package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/core"
)

// pageMessageSQL reads what pepsi-httpd's message page shows of one message,
// by its primary key: only the columns its role may read (never payload),
// and of the state only who failed it and why, cut as the failures list
// cuts it; and its order key, with what a blocked one waits behind
// (keyHeadColumns); its parent (parent_id, 0 for none), how many children it
// has and the ids of the first ChildrenMax of them, oldest first. The
// children are found through schema 19's partial queue_parent index
// (parent_id = $1 implies its predicate): the count reads every child's
// entry, the list sorts them, so both cost what the message's children
// number, which EMIT_MAX bounds per pass.
var pageMessageSQL = `SELECT q.stage, q.status, CASE WHEN isfinite(q.timeout) THEN q.timeout END, q.attempts, q.created_at, q.updated_at,
	CASE WHEN q.state ? 'dispatch_error' THEN 'dispatcher' WHEN q.state ? 'error' THEN 'stage' ELSE '' END,
	left(coalesce(q.state->>'dispatch_error', q.state->>'error', ''), ` + fmt.Sprint(ReasonMax) + `), ` + keyHeadColumns + `,
	coalesce(q.parent_id, 0), (SELECT count(*) FROM pepsi.queue c WHERE c.parent_id = q.ingress_id),
	ARRAY(SELECT c.ingress_id FROM pepsi.queue c WHERE c.parent_id = q.ingress_id ORDER BY c.ingress_id LIMIT ` + fmt.Sprint(ChildrenMax) + `)
FROM pepsi.queue q ` + keyHeadJoin + ` WHERE q.ingress_id = $1`

// ChildrenMax is how many of a message's children its page lists (it counts
// them all).
const ChildrenMax = 20

// payloadSizeSQL reads one message's payload size through schema 20's
// pepsi.payload_size, which a role without SELECT on payload (pepsi_monitor)
// may execute: the length, never the bytes.
const payloadSizeSQL = `SELECT pepsi.payload_size($1)`

// PageMessage is one message as pepsi-httpd's message page shows it: never
// its payload nor its state, only who failed it and why.
type PageMessage struct {
	ID     int64
	Stage  string
	Status core.RowStatus
	// Timeout is when a paused message is due (nil for none, or for a pause
	// for good).
	Timeout   *time.Time
	Attempts  int
	CreatedAt time.Time
	UpdatedAt time.Time
	// By is "dispatcher" (state.dispatch_error), "stage" (state.error) or "";
	// Reason is the reason given, cut to ReasonMax characters.
	By, Reason string
	// OrderKey is its order key, "" for none; Head, for a blocked message,
	// the message of its key it waits behind (see Message.Head).
	OrderKey string
	Head     *KeyHead
	// ParentID is the message whose pass emitted this one, 0 for none;
	// Children counts the messages this one's passes emitted, and
	// FirstChildren are the ids of the first ChildrenMax of them, oldest
	// first.
	ParentID      int64
	Children      int64
	FirstChildren []int64
}

// ReadPageMessage reads message id for pepsi-httpd's message page, or
// returns ErrNotFound.
func (s *PG) ReadPageMessage(ctx context.Context, id int64) (PageMessage, error) {
	m := PageMessage{ID: id}
	var k keyHeadScan
	err := s.db.QueryRow(ctx, pageMessageSQL, id).Scan(append(append([]any{&m.Stage, &m.Status, &m.Timeout, &m.Attempts,
		&m.CreatedAt, &m.UpdatedAt, &m.By, &m.Reason}, k.dest()...), &m.ParentID, &m.Children, &m.FirstChildren)...)
	m.OrderKey, m.Head = k.orderKey, k.head()
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return PageMessage{}, ErrNotFound
	case err != nil:
		return PageMessage{}, fmt.Errorf("read message %d: %w", id, err)
	}
	if m.Status != core.StatusPaused {
		m.Timeout = nil // it keeps its last value after a wake: it means nothing then
	}
	return m, nil
}

// PayloadSize reads the size in bytes of message id's payload, nil for a
// message without one (or no such message), through pepsi.payload_size: a
// role that may not read payloads may read their sizes.
func (s *PG) PayloadSize(ctx context.Context, id int64) (*int64, error) {
	var n *int64
	if err := s.db.QueryRow(ctx, payloadSizeSQL, id).Scan(&n); err != nil {
		return nil, fmt.Errorf("read the payload size of message %d: %w", id, err)
	}
	return n, nil
}
