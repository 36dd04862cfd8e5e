package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/pepsi-pipeline/pepsi/internal/msgjson"
	"github.com/pepsi-pipeline/pepsi/queueadmin"
)

// lineMax bounds one input line (one payload); a longer line is an error rather
// than an unbounded buffer.
const lineMax = 16 << 20

// source yields the messages to enqueue, one per call, and io.EOF at the end.
type source interface {
	next() (queueadmin.NewMessage, error)
}

// synthetic yields n messages "synthetic message I" for I = 1..n.
type synthetic struct{ i, n int }

func (s *synthetic) next() (queueadmin.NewMessage, error) {
	if s.i >= s.n {
		return queueadmin.NewMessage{}, io.EOF
	}
	s.i++
	return queueadmin.NewMessage{Payload: []byte(fmt.Sprintf("synthetic message %d", s.i))}, nil
}

// single yields one message once.
type single struct {
	payload []byte
	done    bool
}

func (s *single) next() (queueadmin.NewMessage, error) {
	if s.done {
		return queueadmin.NewMessage{}, io.EOF
	}
	s.done = true
	return queueadmin.NewMessage{Payload: s.payload}, nil
}

// lines yields one message per input line that is not blank (white space
// only), the line without its "\n" or "\r\n" as the payload.
type lines struct {
	sc   *bufio.Scanner
	line int
	json bool // each line is an NDJSON object (see ndjsonMessage)
}

func newLines(r io.Reader, ndjson bool) *lines {
	sc := bufio.NewScanner(r)
	// Room for a line of lineMax bytes and its "\r\n": the scanner counts the
	// terminator in its limit, and must read past a last line of lineMax bytes
	// to see the end of the input. next refuses a longer line itself.
	sc.Buffer(make([]byte, 0, 64<<10), lineMax+2)
	sc.Split(scanLines)
	return &lines{sc: sc, json: ndjson}
}

// scanLines is bufio.ScanLines except at the end of the input: a last line
// without "\n" keeps a trailing "\r", which is the payload's, since only "\n"
// or "\r\n" end a line (bufio.ScanLines drops it).
func scanLines(data []byte, atEOF bool) (advance int, token []byte, err error) {
	if i := bytes.IndexByte(data, '\n'); i >= 0 {
		return i + 1, bytes.TrimSuffix(data[:i], []byte("\r")), nil
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}

func (l *lines) next() (queueadmin.NewMessage, error) {
	for l.sc.Scan() {
		l.line++
		text := l.sc.Bytes() // scanLines has dropped the "\n" or "\r\n"
		if len(text) > lineMax {
			return queueadmin.NewMessage{}, fmt.Errorf("input line %d is longer than %d bytes", l.line, lineMax)
		}
		if len(bytes.TrimSpace(text)) == 0 {
			continue
		}
		if !l.json {
			return queueadmin.NewMessage{Payload: bytes.Clone(text)}, nil
		}
		m, err := ndjsonMessage(text)
		if err != nil {
			return m, fmt.Errorf("input line %d: %w", l.line, err)
		}
		return m, nil
	}
	if err := l.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return queueadmin.NewMessage{}, fmt.Errorf("input line %d is longer than %d bytes", l.line+1, lineMax)
		}
		return queueadmin.NewMessage{}, fmt.Errorf("read input: %w", err)
	}
	return queueadmin.NewMessage{}, io.EOF
}

// interruptible yields the messages of a source that reads standard input,
// read in a goroutine of its own, until ctx ends (Ctrl-C, SIGTERM): a read
// blocks until the producer writes a line or closes its end, and the
// interrupt waited for it. A producer that had stalled (a pipe from a
// remote export, a fifo) kept enqueue running after SIGTERM for as long,
// and then it said "timeout: context already done" of the batch it had
// read meanwhile.
type interruptible struct {
	ctx  context.Context
	read chan sourced
}

// sourced is one result of a source's next.
type sourced struct {
	m   queueadmin.NewMessage
	err error
}

// newInterruptible starts reading src; the reader stops at src's end or
// error, or, when ctx ends, once its read returns.
func newInterruptible(ctx context.Context, src source) *interruptible {
	s := &interruptible{ctx: ctx, read: make(chan sourced)}
	go func() {
		for {
			m, err := src.next()
			select {
			case s.read <- sourced{m, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return s
}

func (s *interruptible) next() (queueadmin.NewMessage, error) {
	select {
	case r := <-s.read:
		return r.m, r.err
	case <-s.ctx.Done():
		return queueadmin.NewMessage{}, errors.New("interrupted while it waited for input (the messages read since the last batch are not enqueued)")
	}
}

// ndjsonMessage reads one NDJSON object (internal/msgjson, with order_key,
// traceparent and not_before but without stage and key: -stage names the
// stage, and enqueue does not deduplicate).
func ndjsonMessage(text []byte) (queueadmin.NewMessage, error) {
	m, err := msgjson.Parse(text, msgjson.Fields{OrderKey: true, TraceParent: true, NotBefore: true})
	return queueadmin.NewMessage{Payload: m.Payload, State: m.State, OrderKey: m.OrderKey, TraceParent: m.TraceParent, NotBefore: m.NotBefore}, err
}

// notBeforeOf reads -not-before: an RFC 3339 time, or a duration from now
// ("90s", "2h").
func notBeforeOf(text string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(text); err == nil {
		if d < 0 {
			return time.Time{}, usagef("enqueue", "-not-before %s: a duration must not be negative", text)
		}
		return now.Add(d), nil
	}
	t, err := msgjson.CheckNotBefore(text)
	if err != nil {
		return time.Time{}, usagef("enqueue", "-not-before: %v, or a duration from now such as 90s or 2h", err)
	}
	return t, nil
}

// givenToAll gives src's messages the order key, the traceparent and the
// time given by -order-key, -traceparent ("" for none) and -not-before
// (zero for none), checked; a message's own wins.
func givenToAll(src source, orderKey, traceParent string, notBefore time.Time) (source, error) {
	if !notBefore.IsZero() {
		src = scheduled{source: src, at: notBefore}
	}
	if orderKey != "" {
		if err := msgjson.CheckOrderKey(orderKey); err != nil {
			return nil, usagef("enqueue", "-order-key: %v", err)
		}
		src = keyed{source: src, key: orderKey}
	}
	if traceParent != "" {
		if err := msgjson.CheckTraceParent(traceParent); err != nil {
			return nil, usagef("enqueue", "-traceparent: %v", err)
		}
		src = traced{source: src, tp: traceParent}
	}
	return src, nil
}

// scheduled gives src's messages not_before at, but for a message that has
// its own (an NDJSON line's not_before).
type scheduled struct {
	source
	at time.Time
}

func (s scheduled) next() (queueadmin.NewMessage, error) {
	m, err := s.source.next()
	if err == nil && m.NotBefore.IsZero() {
		m.NotBefore = s.at
	}
	return m, err
}

// traced gives src's messages traceparent tp, but for a message that has
// its own (an NDJSON line's traceparent).
type traced struct {
	source
	tp string
}

func (t traced) next() (queueadmin.NewMessage, error) {
	m, err := t.source.next()
	if err == nil && m.TraceParent == "" {
		m.TraceParent = t.tp
	}
	return m, err
}

// keyed gives src's messages order key key, but for a message that has its
// own (an NDJSON line's order_key).
type keyed struct {
	source
	key string
}

func (k keyed) next() (queueadmin.NewMessage, error) {
	m, err := k.source.next()
	if err == nil && m.OrderKey == "" {
		m.OrderKey = k.key
	}
	return m, err
}
