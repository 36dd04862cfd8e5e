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
// (keyHeadColumns).
var pageMessageSQL = `SELECT q.stage, q.status, CASE WHEN isfinite(q.timeout) THEN q.timeout END, q.attempts, q.created_at, q.updated_at,
	CASE WHEN q.state ? 'dispatch_error' THEN 'dispatcher' WHEN q.state ? 'error' THEN 'stage' ELSE '' END,
	left(coalesce(q.state->>'dispatch_error', q.state->>'error', ''), ` + fmt.Sprint(ReasonMax) + `), ` + keyHeadColumns + `
FROM pepsi.queue q ` + keyHeadJoin + ` WHERE q.ingress_id = $1`

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
}

// ReadPageMessage reads message id for pepsi-httpd's message page, or
// returns ErrNotFound.
func (s *PG) ReadPageMessage(ctx context.Context, id int64) (PageMessage, error) {
	m := PageMessage{ID: id}
	var k keyHeadScan
	err := s.db.QueryRow(ctx, pageMessageSQL, id).Scan(append([]any{&m.Stage, &m.Status, &m.Timeout, &m.Attempts,
		&m.CreatedAt, &m.UpdatedAt, &m.By, &m.Reason}, k.dest()...)...)
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
