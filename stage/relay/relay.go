// Package relay carries a stage program's standard input and output over
// TCP, the way "ssh host stage" does: Serve runs on the far host and starts the
// stage for each connection, with the connection as its standard input and
// output; Pipe runs as the dispatcher's worker (PROGRAM) and copies its own
// standard input to the connection and the connection to its standard output.
// A stage with INPUT = message needs nothing but that byte stream
// (docs/scaling.md, "Stages on other hosts").
//
// It is a transport only: it never counts or changes a line, and keeps
// nothing. A cut connection ends Pipe with an error, so the worker exits
// non-zero and the dispatcher handles it as the crash it is. The one thing
// it looks at is where the stage's lines end: the far stage's exit status
// does not cross the link, so Pipe cannot tell a last line without a
// newline written by a stage that exited by itself with status 0 (an
// answer, to pepsi-dispatch) from one cut off by a crash ("0 >b" of "0 >bx"),
// and drops it, ending non-zero, rather than hand on what may be a wrong
// answer.
package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"sync"
)

// Serve accepts connections on ln until it is closed and runs argv for each,
// with env, its standard input and output the connection and its standard error
// stderr. When the stage exits the connection is closed, which ends the far
// side's Pipe.
func Serve(ln net.Listener, argv, env []string, stderr io.Writer, log *slog.Logger) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("accept: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Env, cmd.Stdin, cmd.Stdout, cmd.Stderr = env, conn, conn, stderr
			if err := cmd.Run(); err != nil {
				log.Warn("stagerelay: stage ended", "program", argv[0], "err", err)
			}
		}()
	}
}

// Pipe connects to addr and copies in to the connection and the connection to
// out until the far side closes it. The end of in is passed on (a half close),
// so the stage finishes what it has and exits. It returns nil only when the
// far side closed the connection after in ended; a connection cut before that
// is an error.
func Pipe(ctx context.Context, addr string, in io.Reader, out io.Writer) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("connect to the stage at %s: %w", addr, err)
	}
	conn := c.(*net.TCPConn)
	defer conn.Close()
	_ = conn.SetNoDelay(true) // answers are small and must not wait for more
	inDone := make(chan error, 1)
	go func() {
		_, err := io.Copy(conn, in)
		if err == nil {
			err = conn.CloseWrite()
		}
		inDone <- err
	}()
	lines := &wholeLines{out: out}
	if _, err := io.Copy(lines, conn); err != nil {
		return fmt.Errorf("read from the stage at %s: %w", addr, err)
	}
	if len(lines.held) > 0 {
		return fmt.Errorf("the stage at %s ended its output with a line without a newline, dropped (%q): whether it exited by itself with status 0, which would make it an answer, does not cross the link", addr, clip(lines.held))
	}
	select {
	case err := <-inDone:
		if err != nil {
			return fmt.Errorf("write to the stage at %s: %w", addr, err)
		}
		return nil
	default:
		// The far side closed while the dispatcher was still writing: the
		// stage (or the link) went away in the middle of the pipeline.
		return fmt.Errorf("the stage at %s closed the connection before the end of its input", addr)
	}
}

// wholeLinesMax bounds what wholeLines holds of a line before it passes it
// on anyway: far more than pepsi-dispatch reads as one answer or emit line,
// which it then refuses as too long, as it would have without the relay.
const wholeLinesMax = 1 << 20

// wholeLines writes to out only whole lines (up to their newline), and holds
// what follows the last one until its newline comes (Pipe).
type wholeLines struct {
	out  io.Writer
	held []byte
}

func (w *wholeLines) Write(p []byte) (int, error) {
	end := bytes.LastIndexByte(p, '\n')
	if end < 0 && len(w.held)+len(p) <= wholeLinesMax {
		w.held = append(w.held, p...)
		return len(p), nil
	}
	if end < 0 {
		end = len(p) - 1 // too long to hold: on it goes
	}
	if len(w.held) > 0 {
		if _, err := w.out.Write(w.held); err != nil {
			return 0, err
		}
		w.held = w.held[:0]
	}
	if _, err := w.out.Write(p[:end+1]); err != nil {
		return 0, err
	}
	w.held = append(w.held, p[end+1:]...)
	return len(p), nil
}

// clip is b cut to at most 100 bytes, for an error message.
func clip(b []byte) string {
	if len(b) > 100 {
		return string(b[:100]) + "…"
	}
	return string(b)
}

// Main is a worker program that pipes to the address in the environment
// variable name: it exits 0 when Pipe returns nil, 1 otherwise.
func Main(name string) {
	addr := os.Getenv(name)
	if addr == "" {
		fmt.Fprintf(os.Stderr, "stagerelay: %s is not set\n", name)
		os.Exit(2)
	}
	if err := Pipe(context.Background(), addr, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "stagerelay:", err)
		os.Exit(1)
	}
	os.Exit(0)
}
