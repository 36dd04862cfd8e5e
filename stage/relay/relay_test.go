package relay_test

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/stage/relay"
)

// farSide accepts one connection, reads until the near side's half close,
// writes chunks with a pause between them (so they cross as separate reads)
// and closes: a far stage that wrote them and exited.
func farSide(t *testing.T, chunks ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var buf [64]byte
		for {
			if _, err := c.Read(buf[:]); err != nil {
				break
			}
		}
		for _, ch := range chunks {
			if _, err := c.Write([]byte(ch)); err != nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return ln.Addr().String()
}

// Pipe hands on whole lines, however they are cut into reads, and drops a
// last line without a newline, ending with an error: the far stage's exit
// status does not cross the link, so Pipe cannot tell an answer from a line
// cut off by a crash ("0 >b" of "0 >bx"), and pepsi-dispatch must not take
// it for the worker's answer (docs/protocol.md).
func TestPipeHandsOnWholeLinesAndDropsAnUnendedLastOne(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		chunks []string
		want   string
		err    string
	}{
		{"whole lines", []string{"0 >done\n", "1 bad\n"}, "0 >done\n1 bad\n", ""},
		{"a line across reads", []string{"0 >do", "ne\n0 >b"}, "0 >done\n", "ended its output with a line without a newline, dropped (\"0 >b\")"},
		{"only a cut line", []string{"0 >b"}, "", "line without a newline, dropped (\"0 >b\")"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			err := relay.Pipe(context.Background(), farSide(t, c.chunks...), strings.NewReader("1\n"), &out)
			if out.String() != c.want {
				t.Errorf("handed on %q; want %q", out.String(), c.want)
			}
			switch {
			case c.err == "" && err != nil:
				t.Errorf("Pipe: %v; want nil", err)
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Errorf("Pipe: %v; want an error containing %q", err, c.err)
			}
		})
	}
}
