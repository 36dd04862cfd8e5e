package pipeline_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/examples/pepsi-example/pipeline"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/stage"
)

// serve runs pepsi-example's stage name, as pepsi-dispatch starts it, over one
// row per state, each running at name with payload, and returns its answers.
func serve(t *testing.T, name string, payload []byte, states ...string) []string {
	t.Helper()
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
	var in strings.Builder
	for _, state := range states {
		var id int64
		err := conn.QueryRow(context.Background(),
			`INSERT INTO pepsi.queue (stage, status, payload, state) VALUES ($1, 'running', $2, $3) RETURNING ingress_id`,
			name, payload, state).Scan(&id)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&in, "%d\n", id)
	}
	var out strings.Builder
	err := stage.Run(context.Background(), stage.Options{Stage: name, DB: url, Handlers: pipeline.Handlers(),
		Fused: pipeline.Fused, In: strings.NewReader(in.String()), Out: &out, Log: stage.NewLogger(&strings.Builder{})})
	if err != nil {
		t.Fatalf("stage.Run(%s) = %v", name, err)
	}
	return strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
}

// Each stage of the example answers its transition with its state changes, for
// the dispatcher to write: the end-to-end run of the demo needs a dispatcher
// that reads these lines.
func TestExampleStagesAnswerTheirTransitions(t *testing.T) {
	t.Parallel()
	var pauses []byte
	for i := 1; pauses == nil; i++ {
		if p := pipeline.Payload(i); i%100 != 0 && pipeline.PausesOnce(p) {
			pauses = p
		}
	}
	parsed := `{"amount_cents": 25000, "customer": "c7", "order": 7}`
	for _, c := range []struct {
		name    string
		payload []byte
		states  []string
		want    []string
	}{
		{pipeline.Parse, []byte("order=7 customer=c7 amount=250.00"), []string{`{}`},
			[]string{`0 >enrich \{"amount_cents":25000,"customer":"c7","order":7\}`}},
		// parse fails a bad order itself: no answer says "failed".
		{pipeline.Parse, []byte("order=7 customer=c7 amount=n/a"), []string{`{}`}, []string{`0`}},
		// tag is fused into enrich's pass.
		{pipeline.Enrich, []byte("order=7 customer=c7 amount=250.00"), []string{parsed},
			[]string{`0 >deliver tag:\d+ \{"region":"(eu|us|apac)","tags":\["large".*\]\}`}},
		{pipeline.Deliver, pauses, []string{parsed, `{"deliver_attempts": 1}`}, []string{
			`0 >paused:(0\.9\d*|1) \{"deliver_attempts":1\}`,
			`0 >audit \{"deliver_attempts":2,"delivered":true\}`,
		}},
	} {
		got := serve(t, c.name, c.payload, c.states...)
		if len(got) != len(c.want) {
			t.Errorf("%s of %q: answers %q, want %d", c.name, c.payload, got, len(c.want))
			continue
		}
		for i, want := range c.want {
			if !regexp.MustCompile(`^` + want + `$`).MatchString(got[i]) {
				t.Errorf("%s of %q: answer %q, want it to match %q", c.name, c.payload, got[i], want)
			}
		}
	}
}
