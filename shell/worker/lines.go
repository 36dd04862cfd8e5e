package worker

import (
	"bufio"
	"bytes"
	"errors"
	"io"

	"github.com/pepsi-pipeline/pepsi/core"
)

// lineMax is the longest line this package passes on, in bytes: the core's
// AnswerMax. A longer stdout line is reported cut to lineMax (core.Answer.Cut:
// the core calls it a protocol error); a longer stderr line is logged cut.
// Neither is fatal here, and neither can make the dispatcher buffer without
// bound.
const lineMax = core.AnswerMax

// readLines calls emit for every line of r, in order, without its "\n" or "\r\n".
// A final line without a newline still counts, with unterminated set (the
// core judges it by how the worker ended: core.Answer.Unterminated). A line
// longer than lineMax is passed on as its first lineMax bytes with cut set,
// and the rest of it is discarded. It returns nil at end of input, else the
// read error.
func readLines(r io.Reader, emit func(line string, cut, unterminated bool)) error {
	// Room for a line of lineMax bytes and its "\r\n": a line of exactly
	// lineMax bytes is whole, as the protocol says.
	br := bufio.NewReaderSize(r, lineMax+2)
	for {
		line, err := br.ReadSlice('\n')
		switch {
		case err == nil:
			line = trimEOL(line)
			if len(line) > lineMax {
				emit(string(line[:lineMax]), true, false)
				continue
			}
			emit(string(line), false, false)
		case errors.Is(err, bufio.ErrBufferFull):
			emit(string(line[:lineMax]), true, false)
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
		default:
			if len(line) > lineMax {
				emit(string(line[:lineMax]), true, true)
			} else if len(line) > 0 {
				emit(string(line), false, true)
			}
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}

// trimEOL removes a trailing "\n" or "\r\n".
func trimEOL(line []byte) []byte {
	line = bytes.TrimSuffix(line, []byte("\n"))
	return bytes.TrimSuffix(line, []byte("\r"))
}
