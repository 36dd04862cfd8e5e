// The standard input of an INPUT = message stage: the line the core builds from
// a claimed row, and the limit on its length.

package core

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Message is a claimed row's content, read by the claim for a stage whose
// INPUT is message (Cap.LineMax > 0) and nil for any other.
type Message struct {
	// State is the state column as JSON text (as PostgreSQL prints jsonb).
	State string
	// Payload is the payload column; nil when it is NULL or was not read
	// because PayloadSize is over the claim's LineMax.
	Payload []byte
	// PayloadSize is the payload's length in bytes, -1 when it is NULL. The
	// claim reports it even for a payload it did not read, so the core can say
	// how large the message was.
	PayloadSize int
	// ParentID is the parent_id column: for a message a stage's pass emitted,
	// the id of the message whose pass emitted it; 0 for none.
	ParentID int64
}

func (m *Message) String() string {
	return fmt.Sprintf("{state=%dB payload=%dB}", len(m.State), m.PayloadSize)
}

// MessageLine builds the standard input line of an INPUT = message stage for r,
// without the newline (docs/protocol.md, "Standard input"):
//
//	{"id":N,"stage":"S","attempts":A,"order_key":"K","traceparent":"T","state":{…},"payload":"…"}
//
// order_key is there when the row has one, traceparent (the pass's:
// Row.Trace.Pass) when the claim read one.
// payload is a JSON string when the payload is valid UTF-8, payload_base64
// (standard base64) when it is not, and absent when it is NULL. It returns the
// reason the message cannot be handed over instead when the line would be longer
// than lineMax bytes or the state is not a JSON object.
func MessageLine(r Row, lineMax int) (line, why string) {
	m := r.Message
	assert(m != nil, "message-mode row %d claimed without its message", r.ID)
	if m.PayloadSize > lineMax || len(m.State) > 2*lineMax {
		// The claim did not read the payload; the line would be longer still.
		return "", tooLong(r.ID, lineMax, int64(m.PayloadSize)+int64(len(m.State)))
	}
	var state bytes.Buffer
	if err := json.Compact(&state, []byte(m.State)); err != nil || len(m.State) == 0 || firstByte(m.State) != '{' {
		return "", fmt.Sprintf("message %d: its state is not a JSON object, so it cannot be handed to an INPUT = message stage", r.ID)
	}
	// One strings.Builder, sized once: the line is built in place, so a large
	// payload is copied once (not encoded, copied and converted).
	var b strings.Builder
	b.Grow(80 + len(r.Stage) + len(r.Trace.Pass) + state.Len() + len(m.Payload)*4/3 + 4)
	b.WriteString(`{"id":`)
	b.WriteString(strconv.FormatInt(r.ID, 10))
	b.WriteString(`,"stage":`)
	b.WriteString(strconv.Quote(r.Stage)) // stage names are letters, digits, '_' and '-'
	b.WriteString(`,"attempts":`)
	b.WriteString(strconv.Itoa(r.Attempts))
	if r.Key != "" {
		b.WriteString(`,"order_key":`)
		writeJSONString(&b, []byte(r.Key))
	}
	if m.ParentID != 0 {
		b.WriteString(`,"parent_id":`)
		b.WriteString(strconv.FormatInt(m.ParentID, 10))
	}
	if r.Trace.Pass != "" {
		b.WriteString(`,"traceparent":`)
		writeJSONString(&b, []byte(r.Trace.Pass))
	}
	b.WriteString(`,"state":`)
	b.Write(state.Bytes())
	switch {
	case m.PayloadSize < 0:
	case utf8.Valid(m.Payload):
		b.WriteString(`,"payload":`)
		writeJSONString(&b, m.Payload)
	default:
		b.WriteString(`,"payload_base64":"`)
		enc := base64.NewEncoder(base64.StdEncoding, &b)
		_, _ = enc.Write(m.Payload) // a strings.Builder does not fail
		_ = enc.Close()
		b.WriteByte('"')
	}
	b.WriteByte('}')
	if b.Len() > lineMax {
		return "", tooLong(r.ID, lineMax, int64(b.Len()))
	}
	return b.String(), ""
}

// writeJSONString writes p, valid UTF-8, as a JSON string: quotes, backslashes
// and control characters escaped, everything else as it is.
func writeJSONString(b *strings.Builder, p []byte) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	start := 0
	for i, c := range p {
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b.Write(p[start:i])
		switch c {
		case '"', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			b.WriteString(`\u00`)
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
		}
		start = i + 1
	}
	b.Write(p[start:])
	b.WriteByte('"')
}

func tooLong(id int64, lineMax int, size int64) string {
	return fmt.Sprintf("message %d is too large for INPUT = message: its line would be at least %d bytes, over LINE_MAX (%d bytes)", id, size, lineMax)
}

// firstByte is the first byte of s that is not JSON white space.
func firstByte(s string) byte {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case ' ', '\t', '\n', '\r':
			continue
		}
		return s[i]
	}
	return 0
}
