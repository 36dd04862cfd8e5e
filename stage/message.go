package stage

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/internal/msgjson"
	"github.com/pepsi-pipeline/pepsi/internal/traceparent"
)

// messageLineMax bounds one input line in message mode: the most LINE_MAX
// allows (pepsi.conf(5)); the dispatcher never sends a longer line.
const messageLineMax = conf.LineMaxMax

// errNoDatabase is what Message.Tx answers in message mode.
var errNoDatabase = errors.New("stage: INPUT = message: this stage has no database; Message.Tx cannot be used (use INPUT = id)")

// runMessages serves an INPUT = message stage: each line is a message, handled
// and answered in order, with no database at all.
func (w *worker) runMessages(ctx context.Context, in io.Reader, out *answerWriter) error {
	r := bufio.NewReaderSize(in, 64<<10)
	for {
		if err := out.flush(); err != nil {
			return fmt.Errorf("write answers: %w", err)
		}
		line, err := readLine(r, messageLineMax)
		if err == io.EOF {
			return nil
		} else if err != nil {
			return fmt.Errorf("read messages: %w", err)
		}
		if strings.TrimSpace(line) == "" {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := out.write(w.message(ctx, line)); err != nil {
			return fmt.Errorf("write answer: %w", err)
		}
	}
}

// readLine reads one line of at most max bytes, without its newline; a last
// line without a newline counts.
func readLine(r *bufio.Reader, max int) (string, error) {
	var buf []byte
	for {
		part, err := r.ReadSlice('\n')
		buf = append(buf, part...)
		if len(buf) > max+1 {
			return "", fmt.Errorf("input line longer than %d bytes", max)
		}
		switch {
		case err == nil:
			return string(buf[:len(buf)-1]), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF && len(buf) > 0:
			return string(buf), nil
		}
		return "", err
	}
}

// message handles one input line of message mode and returns its answer. The
// handler's transition goes on the line with its state changes as the patch;
// what only a database could write (Failed, a deleted state key, Message.Tx)
// is answered as this message's failure with a reason saying why. The
// messages the handler emitted go out before the status line of a
// transition, and with no other answer.
func (w *worker) message(ctx context.Context, line string) string {
	// The line is read by the one parser of message lines that pepsi-queue,
	// pepsi-ingress and pepsi-stage-check use too (docs/protocol.md,
	// "Standard input"), so that all agree on every field.
	in, err := msgjson.Parse([]byte(line), msgjson.Fields{Line: true, Stage: true, TraceParent: true, IgnoreUnknown: true})
	if err != nil {
		w.log.Error("input line is not a message", "stage", w.stage, "line", clip(line, 200), "err", err)
		return failure(fmt.Sprintf("not a message (%v): %q", err, clip(line, 200)))
	}
	m := &Message{ID: in.ID, Stage: w.stage, Attempts: in.Attempts, OrderKey: in.OrderKey, TraceParent: in.TraceParent,
		Payload: in.Payload, Tx: &lazyTx{w: w, err: errNoDatabase}}
	state := in.State
	if len(state) == 0 {
		state = json.RawMessage("{}")
	}
	var before map[string]json.RawMessage
	if m.State, before, err = decodeState(state); err != nil {
		return failure(fmt.Sprintf("state of message %d: %v", in.ID, err))
	}
	res, by, fused, bad := w.chain(ctx, m)
	if bad != "" {
		return bad
	}
	prefix := ""
	if by != w.stage {
		prefix = by + ": "
	}
	t, bad := w.decide(res, prefix)
	if bad != "" {
		return bad
	}
	move := t.answer
	if move == nil { // Failed: only a database can set state.error
		return failure(t.reason)
	}
	if bad := m.emitsBlock(prefix, ""); bad != "" {
		return bad
	}
	patch, deleted, err := statePatch(before, m.State)
	switch {
	case err != nil:
		return failure(fmt.Sprintf("%sstate cannot be written as JSON: %v", prefix, err))
	case deleted:
		return failure(prefix + "the handler deleted a state key, which an answered patch cannot do (set it to null, or use INPUT = id)")
	}
	move.Patch = string(patch)
	out := core.Status{Fused: fused, Transition: move}.Line()
	// No database here to write a larger state with, as INPUT = id does
	// past answerMax: the line may take all the dispatcher reads of one.
	if len(out) > core.AnswerMax {
		return failure(fmt.Sprintf("%sthe state patch makes the answer %d bytes, over the %d the dispatcher reads of one line (use INPUT = id, whose stages write a larger state themselves)", prefix, len(out), core.AnswerMax))
	}
	return m.withEmits(out)
}

// chain runs the stage's handler and, while it advances to a fused stage, that
// stage's handler in the same pass. It returns the last result, the stage that
// produced it, the fused stages' times, and a failure line instead when the
// fused stages loop.
func (w *worker) chain(ctx context.Context, m *Message) (res Result, by string, fused []core.Fused, bad string) {
	if sc, ok := traceparent.SpanContext(m.TraceParent); ok {
		// The handler's context carries the pass's span context: an
		// application's OpenTelemetry spans are children of the pass.
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	res = w.call(ctx, w.stage, m)
	by = w.stage
	chain := []string{w.stage}
	for res.kind == kindAdvance && w.fused[res.next] {
		if slices.Contains(chain, res.next) {
			return res, by, nil, failure(fmt.Sprintf("fused stages loop: %s -> %s", strings.Join(chain, " -> "), res.next))
		}
		by = res.next
		chain = append(chain, by)
		m.Stage = by
		start := time.Now()
		res = w.call(ctx, by, m)
		fused = append(fused, core.Fused{Stage: by, Micros: time.Since(start).Microseconds()})
	}
	return res, by, fused, ""
}

// clip shortens s to at most n bytes for a log line or a reason.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
