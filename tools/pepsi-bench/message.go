package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/netfault"
	"github.com/pepsi-pipeline/pepsi/shell/worker"
	"github.com/pepsi-pipeline/pepsi/stage/relay"
)

// messageProgram is the name under which pepsi-bench runs as the message-mode
// stage program (INPUT = message), through a link like answerProgram's.
const messageProgram = "pepsi-bench-message"

// relayProgram is the name under which pepsi-bench runs as the worker of the
// relay modes: it carries its standard input and output over TCP to the
// message-mode stage of its PEPSI_STAGE (PEPSI_BENCH_RELAY_<STAGE>), as
// "ssh host stage" would.
const relayProgram = "pepsi-bench-relay"

// pythonScript is the Python stage of python mode: examples/stages/words.py
// with the bench's targets, the standard library only.
const pythonScript = `#!/usr/bin/env python3
import json, os, sys

target = {"a": "b", "b": "c", "c": "done"}[os.environ["PEPSI_STAGE"]]
for line in sys.stdin:
    msg = json.loads(line)
    words = len(msg.get("payload", "").split())
    patch = json.dumps({"words": words}, separators=(",", ":"))
    print("0 >" + target + " " + patch, flush=True)
`

// benchMessage is what the message-mode stage reads of each line.
type benchMessage struct {
	ID      int64  `json:"id"`
	Payload string `json:"payload"`
	State   struct {
		Hops int `json:"hops"`
	} `json:"state"`
}

// messageMain is the message-mode stage program: it parses each message line
// and answers its transition with a patch computed from it (the hop count in
// its state plus one, and its payload's length), flushing whenever it has
// answered all the input that had arrived.
func messageMain(stdin io.Reader, stdout, stderr io.Writer, stage string) int {
	target, ok := answerTargets[stage]
	if !ok {
		fmt.Fprintf(stderr, "%s: PEPSI_STAGE=%q is none of the bench's stages a, b, c\n", messageProgram, stage)
		return 2
	}
	r := bufio.NewReaderSize(stdin, 64<<10)
	w := bufio.NewWriterSize(stdout, 64<<10)
	// Every answer is this line with a patch: the patch is appended to it per
	// message, without building a core.Status each time.
	prefix := []byte(core.Status{Transition: &core.Transition{To: target}}.Line() + ` {"hops":`)
	var buf []byte
	for {
		line, err := r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// A line longer than the buffer (a large payload): read it whole.
			first := append([]byte(nil), line...) // ReadBytes reuses the buffer
			var rest []byte
			rest, err = r.ReadBytes('\n')
			line = append(first, rest...)
		}
		if len(line) > 0 {
			var m benchMessage
			if jerr := json.Unmarshal(line, &m); jerr != nil {
				fmt.Fprintf(stderr, "%s: not a message: %v\n", messageProgram, jerr)
				return 1
			}
			buf = append(buf[:0], prefix...)
			buf = strconv.AppendInt(buf, int64(m.State.Hops+1), 10)
			buf = append(buf, `,"len":`...)
			buf = strconv.AppendInt(buf, int64(len(m.Payload)), 10)
			buf = append(buf, "}\n"...)
			if _, werr := w.Write(buf); werr != nil {
				fmt.Fprintf(stderr, "%s: write the answer: %v\n", messageProgram, werr)
				return 1
			}
		}
		switch {
		case err == io.EOF:
			if w.Flush() != nil {
				return 1
			}
			return 0
		case err != nil:
			fmt.Fprintf(stderr, "%s: read the messages: %v\n", messageProgram, err)
			return 1
		}
		if r.Buffered() == 0 && w.Flush() != nil {
			return 1
		}
	}
}

// relayLatency is the latency the relay modes add to each chunk in each
// direction: half the added round trip.
func (m mode) relayLatency() time.Duration {
	switch m {
	case modeRelay1:
		return 500 * time.Microsecond
	case modeRelay10:
		return 5 * time.Millisecond
	}
	return 0
}

// startRelays starts, for each stage, the "far host" of a relay mode: a
// stage/relay server that runs the message-mode stage for each connection,
// behind the fault proxy adding latency. It returns the dispatcher's extra
// environment and a function that stops them all.
func (b *bench) startRelays(m mode) (env []string, stop func(), err error) {
	var closers []func()
	stop = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	for _, st := range []string{stageA, stageB, stageC} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			stop()
			return nil, nil, err
		}
		var stageEnv []string
		for _, kv := range os.Environ() {
			if !worker.NamesDatabase(kv) {
				stageEnv = append(stageEnv, kv)
			}
		}
		stageEnv = append(stageEnv, "PEPSI_STAGE="+st, "PEPSI_INPUT=message")
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = relay.Serve(ln, []string{b.messageLink, "worker"}, stageEnv, os.Stderr, slog.New(slog.DiscardHandler))
		}()
		proxy, err := netfault.Start(ln.Addr().String())
		if err != nil {
			ln.Close()
			<-done
			stop()
			return nil, nil, err
		}
		proxy.SetLatency(m.relayLatency())
		closers = append(closers, func() { proxy.Close(); ln.Close(); <-done })
		env = append(env, "PEPSI_BENCH_RELAY_"+st+"="+proxy.Addr())
	}
	return env, stop, nil
}

// runRelayWorker is main for the relay modes' worker.
func runRelayWorker() {
	relay.Main("PEPSI_BENCH_RELAY_" + os.Getenv("PEPSI_STAGE"))
}

// runMessageWorker is main for the message-mode stage program.
func runMessageWorker() {
	os.Exit(messageMain(os.Stdin, os.Stdout, os.Stderr, os.Getenv("PEPSI_STAGE")))
}

// linkPrograms makes the links (and the Python script) the message, python
// and relay modes name as PROGRAM.
func (b *bench) linkPrograms() error {
	b.messageLink = filepath.Join(b.dir, messageProgram)
	if err := os.Symlink(b.self, b.messageLink); err != nil {
		return fmt.Errorf("the message-mode stage program: %w", err)
	}
	b.relayLink = filepath.Join(b.dir, relayProgram)
	if err := os.Symlink(b.self, b.relayLink); err != nil {
		return fmt.Errorf("the relay worker: %w", err)
	}
	b.pythonStage = filepath.Join(b.dir, "pepsi-bench-stage.py")
	return os.WriteFile(b.pythonStage, []byte(pythonScript), 0o755)
}
