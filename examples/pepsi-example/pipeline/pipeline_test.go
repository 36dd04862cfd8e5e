package pipeline_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/examples/pepsi-example/pipeline"
	"github.com/pepsi-pipeline/pepsi/stage"
)

func TestDemoPayloadsFailAndPauseAtTheAdvertisedRates(t *testing.T) {
	t.Parallel()
	var payloads [][]byte
	for i := 1; i <= 10000; i++ {
		payloads = append(payloads, pipeline.Payload(i))
	}
	e := pipeline.Expect(payloads)
	if e.Failed != 100 || e.Done != 9900 {
		t.Errorf("Expect = %+v, want 100 failed (every hundredth) and 9900 done", e)
	}
	if e.Paused < 400 || e.Paused > 600 {
		t.Errorf("Expect = %+v, want about 5%% of the done messages paused once (400..600)", e)
	}
}

// pass runs one stage handler on a message the way the stage library would
// between passes: the state goes through JSON, numbers come back as json.Number.
func pass(t *testing.T, name string, payload []byte, state map[string]any) (stage.Result, map[string]any) {
	t.Helper()
	raw, err := json.Marshal(state)
	if err != nil {
		t.Fatal(err)
	}
	m := &stage.Message{ID: 1, Stage: name, Payload: payload, State: map[string]any{}}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if err := d.Decode(&m.State); err != nil {
		t.Fatal(err)
	}
	return pipeline.Handlers()[name](context.Background(), m), m.State
}

func TestParseFailsAnOrderWithoutANumericAmount(t *testing.T) {
	t.Parallel()
	res, _ := pass(t, pipeline.Parse, pipeline.Payload(300), map[string]any{})
	if got := res.String(); got != `failed: amount "n/a" is not a number like 12.50` {
		t.Errorf("parse of %q = %s, want it failed with the reason", pipeline.Payload(300), got)
	}
	res, _ = pass(t, pipeline.Parse, []byte("order=1 amount=3"), map[string]any{})
	if got := res.String(); got != "failed: no customer field" {
		t.Errorf("parse without customer = %s, want failed: no customer field", got)
	}
}

// walk runs a payload from parse through deliver's decision, with tag run
// inside enrich's pass as pepsi-example fuses it.
func walk(t *testing.T, payload []byte, state map[string]any) (stage.Result, map[string]any) {
	t.Helper()
	res, state := pass(t, pipeline.Parse, payload, state)
	if res.String() != "advance enrich" {
		t.Fatalf("parse = %s, want advance enrich", res)
	}
	res, state = pass(t, pipeline.Enrich, payload, state)
	if res.String() != "advance tag" {
		t.Fatalf("enrich = %s, want advance tag", res)
	}
	res, state = pass(t, pipeline.Tag, payload, state)
	if res.String() != "advance deliver" {
		t.Fatalf("tag = %s, want advance deliver", res)
	}
	return pass(t, pipeline.Deliver, payload, state)
}

func TestAnOrderTravelsToAuditWithItsEnrichment(t *testing.T) {
	t.Parallel()
	var payload []byte
	for i := 1; ; i++ { // the first payload that neither fails nor pauses
		if p := pipeline.Payload(i); i%100 != 0 && !pipeline.PausesOnce(p) {
			payload = p
			break
		}
	}
	res, state := walk(t, payload, map[string]any{})
	if res.String() != "advance audit" {
		t.Fatalf("deliver of %q = %s, want advance audit", payload, res)
	}
	for _, key := range []string{"order", "customer", "amount_cents", "region", "tags", "delivered"} {
		if state[key] == nil {
			t.Errorf("state %v has no %s", state, key)
		}
	}
	if state["deliver_attempts"] != int64(1) {
		t.Errorf("deliver_attempts = %v, want 1", state["deliver_attempts"])
	}
}

func TestDeliverPausesSomeOrdersOnceThenLetsThemThrough(t *testing.T) {
	t.Parallel()
	var payload []byte
	for i := 1; payload == nil; i++ {
		if p := pipeline.Payload(i); i%100 != 0 && pipeline.PausesOnce(p) {
			payload = p
		}
	}
	res, state := walk(t, payload, map[string]any{})
	if !strings.HasPrefix(res.String(), "pause until ") {
		t.Fatalf("first deliver of %q = %s, want a pause", payload, res)
	}
	res, state = pass(t, pipeline.Deliver, payload, state)
	if res.String() != "advance audit" || state["deliver_attempts"] != int64(2) {
		t.Errorf("second deliver = %s with attempts %v, want advance audit after 2 attempts", res, state["deliver_attempts"])
	}
}
