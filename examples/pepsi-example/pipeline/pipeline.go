// Package pipeline is the example pipeline that pepsi-example serves and
// pepsi-demo drives:
//
//	parse -> enrich (+ tag, fused into enrich's pass) -> deliver -> audit -> done
//
// parse reads an order from the payload and fails the message (as failed, with
// state.error) when its amount is not a number; enrich and tag add a region and
// tags; deliver parks about one message in twenty for RetryDelay on its first
// attempt, and lets it through on the second; audit is testdata/stages/audit.sh,
// a stage in plain sh, which finishes the message as done.
//
// Every decision depends only on the payload, so the demo can predict the end
// state exactly (Expect). This package does no I/O of its own: the stage library
// does the queue work around these handlers.
package pipeline

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/pepsi-pipeline/pepsi/stage"
)

// The stages of the pipeline. Audit is served by testdata/stages/audit.sh.
const (
	Parse   = "parse"
	Enrich  = "enrich"
	Tag     = "tag"
	Deliver = "deliver"
	Audit   = "audit"
)

// Fused lists the stages pepsi-example runs inside another stage's pass.
var Fused = []string{Tag}

// RetryDelay is how long deliver parks a message it pauses.
const RetryDelay = time.Second

// Handlers returns the handlers pepsi-example serves.
func Handlers() map[string]stage.Handler {
	return map[string]stage.Handler{Parse: parse, Enrich: enrich, Tag: tag, Deliver: deliver}
}

// Payload returns the demo's i-th payload (i from 1): an order line such as
// "order=7 customer=c7 amount=123.45". Every hundredth has amount "n/a", which
// parse rejects.
func Payload(i int) []byte {
	amount := fmt.Sprintf("%d.%02d", (i*7919)%50000/100, (i*7919)%100)
	if i%100 == 0 {
		amount = "n/a"
	}
	return []byte(fmt.Sprintf("order=%d customer=c%d amount=%s", i, i%97, amount))
}

// Order is what parse reads from a payload.
type Order struct {
	ID          int64
	Customer    string
	AmountCents int64
}

// ParseOrder reads "order=N customer=C amount=D.DD" (fields in any order).
func ParseOrder(payload []byte) (Order, error) {
	var o Order
	seen := map[string]bool{}
	for _, field := range bytes.Fields(payload) {
		key, value, ok := bytes.Cut(field, []byte("="))
		if !ok {
			return o, fmt.Errorf("field %q is not key=value", field)
		}
		seen[string(key)] = true
		switch string(key) {
		case "order":
			n, err := strconv.ParseInt(string(value), 10, 64)
			if err != nil {
				return o, fmt.Errorf("order %q is not a number", value)
			}
			o.ID = n
		case "customer":
			o.Customer = string(value)
		case "amount":
			f, err := strconv.ParseFloat(string(value), 64)
			if err != nil || f < 0 {
				return o, fmt.Errorf("amount %q is not a number like 12.50", value)
			}
			o.AmountCents = int64(f*100 + 0.5)
		default:
			return o, fmt.Errorf("unknown field %q", key)
		}
	}
	for _, k := range []string{"order", "customer", "amount"} {
		if !seen[k] {
			return o, fmt.Errorf("no %s field", k)
		}
	}
	return o, nil
}

// PausesOnce reports whether deliver parks this payload once before letting it
// through (one payload in twenty, by hash).
func PausesOnce(payload []byte) bool { return hash(payload)%20 == 0 }

// Expectation is the end state the pipeline must reach for a set of payloads.
type Expectation struct {
	// Done and Failed count the messages that must end done and failed.
	Done, Failed int
	// Paused counts the done messages that deliver paused once (so their
	// state.deliver_attempts is 2).
	Paused int
}

// Expect predicts the end state for payloads.
func Expect(payloads [][]byte) Expectation {
	var e Expectation
	for _, p := range payloads {
		if _, err := ParseOrder(p); err != nil {
			e.Failed++
			continue
		}
		e.Done++
		if PausesOnce(p) {
			e.Paused++
		}
	}
	return e
}

var regions = []string{"eu", "us", "apac"}

func parse(_ context.Context, m *stage.Message) stage.Result {
	o, err := ParseOrder(m.Payload)
	if err != nil {
		return stage.Failed(err.Error())
	}
	m.State["order"] = o.ID
	m.State["customer"] = o.Customer
	m.State["amount_cents"] = o.AmountCents
	return stage.Advance(Enrich)
}

func enrich(_ context.Context, m *stage.Message) stage.Result {
	customer, _ := m.State["customer"].(string)
	if customer == "" {
		return stage.Error("state.customer is missing: did parse run?")
	}
	m.State["region"] = regions[hash([]byte(customer))%uint32(len(regions))]
	return stage.Advance(Tag)
}

func tag(_ context.Context, m *stage.Message) stage.Result {
	cents, err := intState(m, "amount_cents")
	if err != nil {
		return stage.Error(err.Error())
	}
	tags := []string{}
	if cents >= 25000 {
		tags = append(tags, "large")
	}
	if m.State["region"] == "eu" {
		tags = append(tags, "vat")
	}
	m.State["tags"] = tags
	return stage.Advance(Deliver)
}

func deliver(_ context.Context, m *stage.Message) stage.Result {
	attempts, err := intState(m, "deliver_attempts")
	if err != nil {
		return stage.Error(err.Error())
	}
	attempts++
	m.State["deliver_attempts"] = attempts
	if attempts == 1 && PausesOnce(m.Payload) {
		return stage.PauseFor(RetryDelay) // the receiver is "busy": try again later
	}
	m.State["delivered"] = true
	return stage.Advance(Audit)
}

// intState reads a whole number from the state: a json.Number when it came from
// the database, an int64 when an earlier handler of the same pass set it; 0 when
// absent.
func intState(m *stage.Message, key string) (int64, error) {
	switch v := m.State[key].(type) {
	case nil:
		return 0, nil
	case int64:
		return v, nil
	case json.Number:
		n, err := v.Int64()
		if err != nil {
			return 0, fmt.Errorf("state.%s = %s is not a whole number", key, v)
		}
		return n, nil
	default:
		return 0, fmt.Errorf("state.%s = %v (%T) is not a whole number", key, v, v)
	}
}

func hash(b []byte) uint32 {
	h := fnv.New32a()
	h.Write(b)
	return h.Sum32()
}
