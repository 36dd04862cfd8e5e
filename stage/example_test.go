package stage_test

import (
	"bytes"
	"context"
	"fmt"

	"github.com/pepsi-pipeline/pepsi/stage"
)

// A stage program is a main that hands its handlers to stage.Main. This one
// serves "parse" and "enrich", and runs "tag" inline in enrich's pass, so a tag
// worker is never needed: pepsi.conf has [stage-parse] and [stage-enrich]
// sections whose PROGRAM is this binary.
func Example() {
	stage.Main(map[string]stage.Handler{
		"parse": func(ctx context.Context, m *stage.Message) stage.Result {
			if !bytes.HasPrefix(m.Payload, []byte("order=")) {
				return stage.Failed("not an order") // finishes the message as failed
			}
			m.State["parsed"] = true       // goes with the transition, as a patch
			return stage.Advance("enrich") // answered "0 >enrich {"parsed":true}"
		},
		"enrich": func(ctx context.Context, m *stage.Message) stage.Result {
			return stage.Advance("tag") // tag is fused: it runs now, in this pass
		},
		"tag": func(ctx context.Context, m *stage.Message) stage.Result {
			return stage.Advance("deliver") // answered "0 >deliver tag:MICROS"
		},
	}, stage.Fuse("tag"))
}

// Handlers are plain functions, so their decisions can be tested without a
// database or a dispatcher.
func ExampleHandler() {
	parse := func(ctx context.Context, m *stage.Message) stage.Result {
		if !bytes.HasPrefix(m.Payload, []byte("order=")) {
			return stage.Failed("not an order")
		}
		m.State["parsed"] = true
		return stage.Advance("enrich")
	}
	for _, payload := range []string{"order=42", "hello"} {
		m := &stage.Message{ID: 1, Stage: "parse", State: map[string]any{}, Payload: []byte(payload)}
		fmt.Printf("%s: %v %v\n", payload, parse(context.Background(), m), m.State)
	}
	// Output:
	// order=42: advance enrich map[parsed:true]
	// hello: failed: not an order map[]
}
