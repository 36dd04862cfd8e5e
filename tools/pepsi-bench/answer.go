package main

import (
	"bufio"
	"fmt"
	"io"
	"os"

	"github.com/pepsi-pipeline/pepsi/core"
)

// answerProgram is the name under which pepsi-bench runs as the answer-mode
// stage program: the bench links it to its own binary in its working directory
// and names that link as PROGRAM, so the dispatcher starts it as
// "pepsi-bench-answer worker …" (argv[0] is how it knows).
const answerProgram = "pepsi-bench-answer"

// libraryProgram is the name under which pepsi-bench runs as the library-mode
// stage program (the stage library answering its transitions), through a link
// like answerProgram's.
const libraryProgram = "pepsi-bench-library"

// answerTargets is where each stage sends a message in answer mode: the TARGET
// of its "0 >TARGET" status line.
var answerTargets = map[string]string{stageA: stageB, stageB: stageC, stageC: "done"}

// answerMain is the answer-mode stage program: the minimal stage any language
// can write under the "0 >TARGET" protocol (docs/protocol.md). It opens
// no database connection and writes nothing: it answers each id with the
// transition and lets the dispatcher write it.
func answerMain(stdin io.Reader, stdout, stderr io.Writer, stage string) int {
	target, ok := answerTargets[stage]
	if !ok {
		fmt.Fprintf(stderr, "%s: PEPSI_STAGE=%q is none of the bench's stages a, b, c\n", answerProgram, stage)
		return 2
	}
	if err := answerLoop(stdin, stdout, core.Status{Transition: &core.Transition{To: target}}.Line()); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", answerProgram, err)
		return 1
	}
	return 0
}

// answerLoop answers every line of in (one message id each) with status, in
// order, and flushes its answers whenever it has read all the input that had
// arrived: a batch of ids handed over at once is answered with one write, and
// no answer waits behind an id that has not come yet. At the end of in it
// flushes and returns nil. It never parses the ids: one line in, one line out
// is the whole protocol a stage that writes nothing has to keep.
func answerLoop(in io.Reader, out io.Writer, status string) error {
	r := bufio.NewReaderSize(in, 64<<10)
	w := bufio.NewWriterSize(out, 64<<10)
	answer := []byte(status + "\n")
	for {
		line, err := r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// An id longer than the buffer: not an id, but still one line.
			for err == bufio.ErrBufferFull {
				_, err = r.ReadSlice('\n')
			}
			line = []byte{'x'}
		}
		if len(line) > 0 {
			if _, werr := w.Write(answer); werr != nil {
				return fmt.Errorf("write the answer: %w", werr)
			}
		}
		if err == io.EOF {
			return w.Flush()
		}
		if err != nil {
			return fmt.Errorf("read the ids: %w", err)
		}
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return fmt.Errorf("write the answers: %w", err)
			}
		}
	}
}

// runAnswerWorker is main for the answer-mode stage program.
func runAnswerWorker() {
	os.Exit(answerMain(os.Stdin, os.Stdout, os.Stderr, os.Getenv("PEPSI_STAGE")))
}
