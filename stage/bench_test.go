package stage_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/stage"
)

// BenchmarkPass measures one message through a worker with a trivial handler.
// Ids arrive in writes of 16, as from a dispatcher with QUEUE_LIMIT 16.
// "answered": the rows of each write are read in one statement and each
// transition is answered ("0 >enrich"); "written": with WriteTransitions, each
// transition is also written and committed by the worker.
func BenchmarkPass(b *testing.B) {
	for _, write := range []bool{false, true} {
		name := map[bool]string{false: "answered", true: "written"}[write]
		b.Run(name, func(b *testing.B) { benchmarkPass(b, write) })
	}
}

func benchmarkPass(b *testing.B, write bool) {
	url := pgtest.NewMigrated(b)
	conn := pgtest.Connect(b, url)
	_, err := conn.Exec(context.Background(), fmt.Sprintf(
		"INSERT INTO pepsi.queue (stage, status, payload) SELECT 'parse', 'running', 'x' FROM generate_series(1, %d)", b.N))
	if err != nil {
		b.Fatal(err)
	}
	in, feed := io.Pipe()
	out := &lineCounter{lines: make(chan struct{}, b.N)}
	done := make(chan error, 1)
	go func() {
		done <- stage.Run(context.Background(), stage.Options{Stage: "parse", DB: url, In: in, Out: out, WriteTransitions: write,
			Handlers: map[string]stage.Handler{"parse": advanceTo("enrich")}})
	}()
	b.ResetTimer()
	go func() {
		for id := 1; id <= b.N; id += 16 {
			var sb strings.Builder
			for j := id; j < id+16 && j <= b.N; j++ {
				fmt.Fprintf(&sb, "%d\n", j)
			}
			if _, err := feed.Write([]byte(sb.String())); err != nil {
				return
			}
		}
		feed.Close()
	}()
	for i := 0; i < b.N; i++ {
		<-out.lines
	}
	b.StopTimer()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// lineCounter signals once per line written to it.
type lineCounter struct{ lines chan struct{} }

func (w *lineCounter) Write(p []byte) (int, error) {
	for _, c := range p {
		if c == '\n' {
			w.lines <- struct{}{}
		}
	}
	return len(p), nil
}
