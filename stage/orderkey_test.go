package stage_test

import (
	"context"
	"testing"

	"github.com/pepsi-pipeline/pepsi/stage"
)

// Proves: in message mode a handler sees the order key of its line (the
// dispatcher's line carries it when the row has one), and none without.
func TestMessageModeHandlersSeeTheOrderKey(t *testing.T) {
	var seen []string
	handlers := map[string]stage.Handler{"parse": func(_ context.Context, m *stage.Message) stage.Result {
		seen = append(seen, m.OrderKey)
		return stage.Done()
	}}
	input := `{"id":1,"stage":"parse","attempts":0,"order_key":"acct-9","state":{},"payload":"x"}
{"id":2,"stage":"parse","attempts":0,"state":{},"payload":"y"}
`
	got := runMessages(t, "parse", input, handlers)
	if len(got) != 2 || got[0] != "0 >done" || got[1] != "0 >done" {
		t.Errorf("answers %q; want two done", got)
	}
	if len(seen) != 2 || seen[0] != "acct-9" || seen[1] != "" {
		t.Errorf("handlers saw order keys %q; want acct-9 and none", seen)
	}
}
