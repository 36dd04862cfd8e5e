package stage

import (
	"fmt"
	"strings"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/core/conf"
)

// Emit is a message a handler emits (Message.Emit): a new message, inserted
// pending at Stage with parent_id the handled message's id, by the
// dispatcher, in the transaction that writes the pass's transition
// (docs/protocol.md, "Emitting messages"). Its fields are pepsi-ingress's.
type Emit struct {
	// Stage is where the new message starts: a stage the dispatcher runs.
	Stage string
	// Payload is its content (nil and empty are both an empty payload).
	// Bytes that are not UTF-8 are sent as payload_base64.
	Payload []byte
	// State is its initial state (nil for {}). It is encoded when Emit is
	// called: later changes to the map do not reach the message.
	State map[string]any
	// Key is its dedup_key ("" for none): a key already in the queue inserts
	// nothing.
	Key string
	// OrderKey is its order key ("" for none; docs/protocol.md, "Ordering
	// per key").
	OrderKey string
}

// emitted is what Message.Emit collected for its pass: the emit lines, in
// order, and the first error, which fails the message.
type emitted struct {
	emits []Emit
	lines []string
	err   error
}

// Emit adds a message for this pass to emit. The library writes it as an
// emit line ("+{…}") before the status line, so the dispatcher inserts it
// exactly when it writes the transition the handler returns, and only then:
//
//   - with Advance, Done or Pause (an answered transition, "0 >TARGET"), the
//     emitted messages exist once the dispatcher's transaction commits, once
//     per committed pass (a pass the dispatcher did not commit runs again and
//     emits again; its earlier emits never existed);
//   - with Failed, Error or Retry nothing is emitted: a pass that failed has
//     no children. The library writes no emit line then, so the dispatcher
//     counts nothing as dropped;
//   - a transition the library must write itself (the handler used
//     Message.Tx, deleted a state key, or changed state by more than a line
//     carries, or Options.WriteTransitions) cannot carry emits, since the
//     dispatcher's transaction is not the one that commits the transition:
//     the message fails with a reason that says so. A handler whose own
//     statements must commit with its children inserts them itself, on
//     Message.Tx.
//
// Emit returns an error, and keeps nothing, for a message that cannot be
// emitted: a Stage that is no stage name, a State that is not JSON or holds
// what PostgreSQL refuses (a NUL), a key too long, a line longer than the
// dispatcher reads (64 KiB), or more than the most EMIT_MAX can allow. The
// message then fails with that error, even if the handler returns Advance,
// Done or Pause: a child is never lost in silence. (A handler that returns
// Failed, Error or Retry decided the pass's fate itself.) The dispatcher
// checks the rest: that Stage is one it runs and that the pass emits at most
// the stage's EMIT_MAX; it fails the message otherwise.
//
// Emits are held in memory until the status line is written: one message's
// at a time.
func (m *Message) Emit(e Emit) error {
	line, err := emitLine(e, len(m.emitted.lines))
	if err != nil {
		err = fmt.Errorf("emit %d: %w", len(m.emitted.lines)+1, err)
		if m.emitted.err == nil {
			m.emitted.err = err
		}
		return err
	}
	m.emitted.emits = append(m.emitted.emits, e)
	m.emitted.lines = append(m.emitted.lines, line)
	return nil
}

// Emits returns the messages the handler emitted so far, in order: for tests
// of a handler, which can build a Message and call it without a dispatcher.
func (m *Message) Emits() []Emit { return append([]Emit(nil), m.emitted.emits...) }

// emitLine checks e and returns its emit line. before is how many the pass
// emitted already.
func emitLine(e Emit, before int) (string, error) {
	if !conf.ValidStageName(e.Stage) {
		return "", fmt.Errorf("stage %q is not a stage name (letters, digits, '_' and '-', at most 63, not done or paused)", e.Stage)
	}
	if before >= conf.EmitMaxMax {
		return "", fmt.Errorf("more than %d emits for one message, the most EMIT_MAX allows", conf.EmitMaxMax)
	}
	ce := core.Emit{Stage: e.Stage, Payload: e.Payload, Key: e.Key, OrderKey: e.OrderKey}
	if e.State != nil {
		state, err := compactJSON(e.State)
		if err != nil {
			return "", fmt.Errorf("state cannot be written as JSON: %w", err)
		}
		ce.State = string(state)
	}
	line := ce.Line()
	if len(line) > core.AnswerMax {
		return "", fmt.Errorf("its line is %d bytes, over the %d the dispatcher reads", len(line), core.AnswerMax)
	}
	// The dispatcher's own reader: what it would refuse, and fail the message
	// for, is refused here, where the handler sees it.
	if _, err := core.ParseEmit(line); err != nil {
		return "", err
	}
	return line, nil
}

// withEmits is the answer of a pass that answers a transition: its emit
// lines, then the status line, one output of lines in order.
func (m *Message) withEmits(status string) string {
	if len(m.emitted.lines) == 0 {
		return status
	}
	return strings.Join(m.emitted.lines, "\n") + "\n" + status
}

// emitsBlock returns the failure line of a pass whose emits cannot go out
// with its transition, or "" when they can: an Emit that failed, or a
// transition the library writes itself (why says why; "" when it does not).
func (m *Message) emitsBlock(prefix, why string) string {
	switch {
	case m.emitted.err != nil:
		return failure(prefix + m.emitted.err.Error())
	case why != "" && len(m.emitted.lines) > 0:
		return failure(fmt.Sprintf("%sthe handler emitted %d messages, but %s, so the library writes the transition itself and emits could not commit with it (emits ride only an answered transition)", prefix, len(m.emitted.lines), why))
	}
	return ""
}
