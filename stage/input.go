package stage

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// lineReader reads the ids on standard input, one line at a time, and can tell
// without blocking whether the next line is already there.
type lineReader struct{ r *bufio.Reader }

func newLineReader(r io.Reader) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(r, idLineMax)}
}

// errLineTooLong reports an input line of idLineMax bytes or more.
var errLineTooLong = fmt.Errorf("input line longer than %d bytes", idLineMax)

// next returns the next line without its end of line, waiting for it. A last
// line without a newline counts; at the end of input it returns io.EOF.
func (l *lineReader) next() (string, error) {
	line, err := l.r.ReadSlice('\n')
	switch {
	case err == nil:
		return string(bytes.TrimSuffix(line, []byte("\n"))), nil
	case errors.Is(err, bufio.ErrBufferFull):
		return "", errLineTooLong
	case err == io.EOF && len(line) > 0:
		return string(line), nil
	}
	return "", err
}

// buffered returns the next line if all of it has already been read from the
// input, and reports whether it had.
func (l *lineReader) buffered() (string, bool) {
	n := l.r.Buffered()
	if n == 0 {
		return "", false
	}
	b, _ := l.r.Peek(n) // n bytes are buffered: Peek cannot fail
	if bytes.IndexByte(b, '\n') < 0 {
		return "", false
	}
	line, _ := l.r.ReadSlice('\n') // the newline is buffered: no read, no error
	return string(bytes.TrimSuffix(line, []byte("\n"))), true
}
