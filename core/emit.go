// Emit lines: the messages a stage's pass emits ("+{…}" before its answer),
// how the core reads them, and what it does with them at the answer
// (docs/protocol.md, "Emitting messages").
//
// Memory: a worker's emits are those of its head message only, at most
// EMIT_MAX of them, each from a line of at most AnswerMax bytes; they ride
// the head's Item (Item.Emits) until the transaction that writes its
// transition, and are dropped with it. So the dispatcher holds at most
// EMIT_MAX × AnswerMax bytes of emits per worker and per owed item.

package core

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pepsi-pipeline/pepsi/core/conf"
)

// Bounds of one emitted message, as pepsi-ingress bounds its messages (the
// fields are the same).
const (
	// EmitKeyMax bounds an emitted message's key (dedup_key), in bytes.
	EmitKeyMax = 256
	// EmitOrderKeyMax bounds an emitted message's order_key, in bytes.
	EmitOrderKeyMax = 200
	// jsonDepthMax bounds the nesting of an emitted message's JSON and of a
	// state patch: PostgreSQL's jsonb parser recurses at each level, and a
	// deep one fails on a server whose max_stack_depth is small (about
	// 12,000 levels at the default 2 MB), with the whole transaction.
	jsonDepthMax = 64
	// EmitLogEvery: emits that insert nothing (before an answer other than a
	// transition, or a guard miss) are logged at most this often per stage.
	EmitLogEvery = time.Minute
)

// Emit is one message a stage's pass emitted: an emit line, "+" and one
// compact JSON object with pepsi-ingress's message fields. It is inserted
// pending at Stage, with parent_id the emitting message's id, in the
// transaction that writes the pass's answered transition, and only if that
// write's guard holds (see Item.Emits).
type Emit struct {
	// Stage is where the message starts: a stage this dispatcher runs.
	Stage string
	// Payload is the message content (never nil: "" is an empty payload).
	Payload []byte
	// State is the initial state, a compact JSON object jsonb accepts, or ""
	// for {}.
	State string
	// Key is the dedup_key, "" for none: an insert of a key already in the
	// queue inserts nothing.
	Key string
	// OrderKey is the order_key, "" for none.
	OrderKey string
	// Claim is decided by the core as the resolve is built (claimEmits): the
	// child is inserted running at Stage, held by the core as if a claim had
	// returned it (Outcome.Children), instead of pending there. It saves
	// the child's pending row version and its claim.
	Claim bool
}

func (e Emit) String() string {
	s := fmt.Sprintf("%s(%dB", e.Stage, len(e.Payload))
	if e.State != "" {
		s += " state=" + strconv.Quote(e.State)
	}
	if e.Key != "" {
		s += " key=" + strconv.Quote(e.Key)
	}
	if e.OrderKey != "" {
		s += " order_key=" + strconv.Quote(e.OrderKey)
	}
	if e.Claim {
		s += " claim"
	}
	return s + ")"
}

// Line writes e as the emit line ParseEmit reads back as e, without the
// newline: "+" and a compact JSON object. The payload is a JSON string when it
// is valid UTF-8, payload_base64 otherwise. Every program that emits (the
// stage library, the simulator, the bench) writes its lines with it.
func (e Emit) Line() string {
	var b strings.Builder
	b.WriteString(`+{"stage":`)
	writeJSONString(&b, []byte(e.Stage))
	if utf8.Valid(e.Payload) {
		b.WriteString(`,"payload":`)
		writeJSONString(&b, e.Payload)
	} else {
		b.WriteString(`,"payload_base64":"`)
		b.WriteString(base64.StdEncoding.EncodeToString(e.Payload))
		b.WriteByte('"')
	}
	if e.State != "" {
		b.WriteString(`,"state":`)
		b.WriteString(e.State)
	}
	if e.Key != "" {
		b.WriteString(`,"key":`)
		writeJSONString(&b, []byte(e.Key))
	}
	if e.OrderKey != "" {
		b.WriteString(`,"order_key":`)
		writeJSONString(&b, []byte(e.OrderKey))
	}
	b.WriteByte('}')
	return b.String()
}

// IsEmitLine reports whether a line a worker wrote is an emit line (starts
// with '+'), not a status line.
func IsEmitLine(line string) bool { return strings.HasPrefix(line, "+") }

// ParseEmit reads one emit line: "+" then one JSON object with "stage"
// (required), "payload" or "payload_base64" (one of them), and optionally
// "state" (an object), "key" and "order_key", the fields and rules of a
// pepsi-ingress message (a non-string payload is its compact JSON text). It
// does not check that the stage is configured. Anything PostgreSQL would
// refuse (a NUL in a key or the state, a lone surrogate, a number numeric
// cannot hold) is refused here, since a child the database refused would fail
// the dispatcher's whole transaction, again and again.
func ParseEmit(line string) (Emit, error) {
	text, ok := strings.CutPrefix(line, "+")
	if !ok {
		return Emit{}, errors.New("not an emit line (no '+')")
	}
	if text != "" && strings.IndexByte(" \t\r\n", text[0]) >= 0 {
		return Emit{}, errors.New("white space after '+': the JSON object follows it at once")
	}
	if d := JSONDepth(text); d > jsonDepthMax {
		return Emit{}, fmt.Errorf("nested more than %d deep", jsonDepthMax)
	}
	if err := MembersError(text, "want stage, payload or payload_base64, and optionally state, key and order_key",
		"stage", "key", "order_key", "payload", "payload_base64", "state"); err != nil {
		return Emit{}, err
	}
	var obj struct {
		Stage         *string         `json:"stage"`
		Key           *string         `json:"key"`
		OrderKey      *string         `json:"order_key"`
		Payload       json.RawMessage `json:"payload"`
		PayloadBase64 *string         `json:"payload_base64"`
		State         json.RawMessage `json:"state"`
	}
	d := json.NewDecoder(strings.NewReader(text))
	d.DisallowUnknownFields()
	if err := d.Decode(&obj); err != nil {
		msg := strings.TrimPrefix(err.Error(), "json: ")
		var ute *json.UnmarshalTypeError
		switch {
		case errors.As(err, &ute) && ute.Field != "":
			return Emit{}, fmt.Errorf("%s: want a %s, got a JSON %s", ute.Field, ute.Type, ute.Value)
		case errors.As(err, &ute):
			return Emit{}, fmt.Errorf("not a JSON object: got a JSON %s", ute.Value)
		case strings.HasPrefix(msg, "unknown field"):
			return Emit{}, fmt.Errorf("%s (want stage, payload or payload_base64, and optionally state, key and order_key)", msg)
		}
		return Emit{}, fmt.Errorf("not a JSON object: %s", msg)
	}
	if err := TrailerError(d, text, func(rest string) string { return conf.Quote(clip(rest, 20)) }); err != nil {
		return Emit{}, err
	}
	return emitOf(obj.Stage, obj.Key, obj.OrderKey, obj.Payload, obj.PayloadBase64, obj.State)
}

// Payload decodes a message's payload from its payload or payload_base64
// field (nil for absent; exactly one of them), as every producer's message
// and emit line gives it: a JSON string is its UTF-8 bytes (text that is
// not UTF-8 is refused, not changed), any other JSON value its compact
// text, payload_base64 standard base64.
func Payload(text json.RawMessage, base64Text *string) ([]byte, error) {
	switch {
	case text != nil && base64Text != nil:
		return nil, errors.New("both payload and payload_base64 given; want one")
	case base64Text != nil:
		b, err := base64.StdEncoding.DecodeString(*base64Text)
		if err != nil {
			return nil, fmt.Errorf("payload_base64: %w", err)
		}
		return b, nil
	case len(text) > 0 && text[0] == '"':
		if why := StringRefuses(text); why != "" {
			return nil, fmt.Errorf("payload: %s (a string payload is UTF-8 text; send other bytes as payload_base64)", why)
		}
		var s string
		if err := json.Unmarshal(text, &s); err != nil {
			return nil, fmt.Errorf("payload: %w", err)
		}
		return []byte(s), nil
	case text != nil:
		var compact bytes.Buffer
		if err := json.Compact(&compact, text); err != nil {
			return nil, fmt.Errorf("payload: %w", err)
		}
		return compact.Bytes(), nil
	}
	return nil, errors.New("no payload (want payload or payload_base64)")
}

// emitOf checks and takes the decoded fields of an emit line (see ParseEmit).
func emitOf(stage, key, orderKey *string, payload json.RawMessage, payloadBase64 *string, state json.RawMessage) (Emit, error) {
	var e Emit
	if stage == nil || *stage == "" {
		return e, errors.New(`no "stage"`)
	}
	e.Stage = *stage
	var err error
	if key != nil {
		if e.Key, err = emitKey("key", *key, EmitKeyMax); err != nil {
			return e, err
		}
	}
	if orderKey != nil {
		if e.OrderKey, err = emitKey("order_key", *orderKey, EmitOrderKeyMax); err != nil {
			return e, err
		}
	}
	if e.Payload, err = Payload(payload, payloadBase64); err != nil {
		return e, err
	}
	if e.Payload == nil {
		e.Payload = []byte{}
	}
	if len(state) > 0 && string(state) != "null" {
		var compact bytes.Buffer
		if err := json.Compact(&compact, state); err != nil {
			return e, fmt.Errorf("state: %w", err)
		}
		if why := checkPatch(compact.String()); why != "" {
			return e, fmt.Errorf("state: %s", why)
		}
		if compact.String() != "{}" {
			e.State = compact.String()
		}
	}
	return e, nil
}

// emitKey checks a key field: 1 to most bytes of UTF-8 without NUL.
func emitKey(name, k string, most int) (string, error) {
	switch {
	case k == "":
		return "", fmt.Errorf("%s is empty; leave it out for a message without one", name)
	case len(k) > most:
		return "", fmt.Errorf("%s is %d bytes long, at most %d", name, len(k), most)
	case strings.IndexByte(k, 0) >= 0 || !utf8.ValidString(k) || strings.ContainsRune(k, utf8.RuneError):
		return "", fmt.Errorf(`%s holds \u0000 or invalid UTF-8`, name)
	}
	return k, nil
}

// JSONDepth is the deepest nesting of arrays and objects in text, read as
// JSON (strings skipped); malformed text is the decoder's to refuse. Emit
// lines and pepsi-ingress's messages (internal/msgjson) bound it alike.
func JSONDepth[T ~string | ~[]byte](text T) int {
	d, most, inString, escaped := 0, 0, false, false
	for i := 0; i < len(text); i++ {
		switch c := text[i]; {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			d++
			most = max(most, d)
		case c == '}' || c == ']':
			d--
		}
	}
	return most
}

// emitLine takes one emit line of worker w for its head message: it is kept
// with the head until its answer, or it makes the head fail at its answer (a
// malformed line, an unknown stage, a line over AnswerMax, more than
// EMIT_MAX); after the first such line the rest are not even read.
func (c *Core) emitLine(w *worker, e Answer) {
	if w.emitErr != "" {
		return
	}
	n := len(w.emits) + 1
	switch {
	case e.Cut:
		w.emitErr = fmt.Sprintf("emit line %d is longer than %d bytes, the most a line may have", n, AnswerMax)
	case n > w.stage.cfg.EmitMax:
		w.emitErr = fmt.Sprintf("more than EMIT_MAX (%d) emit lines for one message", w.stage.cfg.EmitMax)
	default:
		em, err := ParseEmit(e.Line)
		switch {
		case err != nil:
			w.emitErr = fmt.Sprintf("emit line %d is malformed: %v: %s", n, err, conf.Quote(clip(e.Line, 100)))
		case c.byName[em.Stage] == nil:
			w.emitErr = fmt.Sprintf("emit line %d names stage %s, which this dispatcher does not run", n, conf.Quote(clip(em.Stage, 100)))
		default:
			w.emits = append(w.emits, em)
		}
	}
	if w.emitErr != "" {
		w.emits = nil // the message fails: none of them is inserted
	}
}

// takeEmits hands over the emits of w's head at its answer and forgets them,
// with the reason the head must fail instead, if any.
func (w *worker) takeEmits() (emits []Emit, why string) {
	emits, why = w.emits, w.emitErr
	w.emits, w.emitErr = nil, ""
	if why != "" {
		why = fmt.Sprintf("stage %s: %s", w.stage.cfg.Name, why)
	}
	return emits, why
}

// emitsDropped counts emits that insert nothing, because the pass's answer
// was not a transition the dispatcher writes (or its guard missed), and logs
// it at most once per stage every EmitLogEvery.
func (c *Core) emitsDropped(st *stage, n int, id int64, why string) {
	if n == 0 {
		return
	}
	c.stat(st.cfg.Name).EmitsDropped += int64(n)
	st.emitDrops += int64(n)
	if c.now.Before(st.emitLogAt) {
		return
	}
	c.logf(LevelWarn, "stage %s: %d emitted messages inserted nothing since the last such report (last: message %d %s); emits count only before a transition the dispatcher writes (0 >TARGET)",
		st.cfg.Name, st.emitDrops, id, why)
	st.emitDrops = 0
	st.emitLogAt = c.now.Add(EmitLogEvery)
}
