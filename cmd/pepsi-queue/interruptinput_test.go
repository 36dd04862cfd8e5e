package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// An enqueue from a producer that has stalled (no line, no end of input)
// stops at an interrupt (Ctrl-C, SIGTERM) at once, exit 1, saying what it
// had committed: it waited in its read of standard input until the producer
// wrote again or closed its end, however long that was.
func TestAnInterruptedEnqueueDoesNotWaitForItsInput(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	admin := pgtest.Connect(t, url)
	in, producer := io.Pipe()
	t.Cleanup(func() { producer.Close() })
	go fmt.Fprint(producer, "one\ntwo\nthree\n") // and then nothing
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"-database", url, "enqueue", "-stage", "a", "-batch", "2"}, in, &stdout, &stderr)
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pepsi.queue`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("enqueue committed %d messages in 30 s; want its first batch, 2", n)
		}
	}
	time.Sleep(100 * time.Millisecond) // it has read the third line, and waits for more
	cancel()
	select {
	case code := <-done:
		if code != exitFailure || !strings.Contains(stderr.String(), "enqueue stopped after 2 messages (ids 1-2 committed): interrupted while it waited for input") {
			t.Errorf("interrupted enqueue: exit %d, stderr %q; want exit 1, naming the 2 messages committed and the interrupt", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an enqueue interrupted while it waited for input still runs 10 s later")
	}
	var n int
	if err := admin.QueryRow(context.Background(), `SELECT count(*) FROM pepsi.queue`).Scan(&n); err != nil || n != 2 {
		t.Errorf("after the interrupt the queue holds %d messages (%v); want the 2 committed", n, err)
	}
}
