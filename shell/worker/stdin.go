package worker

import (
	"errors"
	"os"
	"slices"
	"sync"
)

var (
	errOverflow = errors.New("write queue full")
	errStopped  = errors.New("standard input is being closed (Stop)")
	errGone     = errors.New("standard input is closed")
)

// stdinWriter feeds one worker's standard input from a bounded queue, so Write
// never blocks its caller on a worker that is slow to read. run, on its own
// goroutine, writes what is queued, oldest first, and closes the pipe after stop
// (once the queue is empty), after abort, or after a failed write.
type stdinWriter struct {
	f         *os.File
	max       int // bytes the queue may hold
	closeOnce sync.Once

	mu       sync.Mutex
	cond     sync.Cond // signalled when queued, stopping or aborted change
	queued   []byte
	stopping bool // close f once queued is written
	aborted  bool // the process exited: write nothing more
	ended    bool // run has returned: nothing queued will ever be written
}

func newStdinWriter(f *os.File, max int) *stdinWriter {
	s := &stdinWriter{f: f, max: max}
	s.cond.L = &s.mu
	return s
}

// enqueue appends b to the queue, whole or not at all.
func (s *stdinWriter) enqueue(b []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.admit(len(b)); err != nil {
		return err
	}
	s.queued = append(s.queued, b...)
	s.cond.Signal()
	return nil
}

// enqueueLines appends lines, each with a newline, to the queue, all or none:
// the lines are copied once, into the queue, and never held elsewhere.
func (s *stdinWriter) enqueueLines(lines []string) error {
	n := 0
	for _, l := range lines {
		n += len(l) + 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.admit(n); err != nil {
		return err
	}
	s.queued = slices.Grow(s.queued, n)
	for _, l := range lines {
		s.queued = append(append(s.queued, l...), '\n')
	}
	s.cond.Signal()
	return nil
}

// admit reports why n more bytes may not be queued, if they may not. s.mu is
// held.
func (s *stdinWriter) admit(n int) error {
	switch {
	case s.ended || s.aborted:
		return errGone
	case s.stopping:
		return errStopped
	case len(s.queued)+n > s.max:
		return errOverflow
	}
	return nil
}

// stop asks run to close standard input once the queue is written.
func (s *stdinWriter) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopping = true
	s.cond.Signal()
}

// stopRequested reports whether stop or abort was called: standard input is
// being, or has been, closed on purpose.
func (s *stdinWriter) stopRequested() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopping || s.aborted
}

// abort drops the queue and closes standard input now, which also ends a write
// blocked on a pipe nobody reads (a grandchild that holds the worker's stdin).
func (s *stdinWriter) abort() {
	s.mu.Lock()
	s.aborted = true
	s.queued = nil
	s.cond.Signal()
	s.mu.Unlock()
	s.close()
}

func (s *stdinWriter) close() {
	// Closing a pipe's write end cannot lose data already written; the reader
	// sees end of file. A second close (abort racing run) is a no-op here.
	s.closeOnce.Do(func() { _ = s.f.Close() })
}

// run writes queued bytes until stop, abort or a write error, then closes the
// pipe. It returns the write error, if any.
func (s *stdinWriter) run() error {
	defer s.close()
	var buf []byte
	for {
		s.mu.Lock()
		for len(s.queued) == 0 && !s.stopping && !s.aborted {
			s.cond.Wait()
		}
		if s.aborted || len(s.queued) == 0 {
			s.ended = true
			s.mu.Unlock()
			return nil
		}
		// Swap buffers: Write may go on queueing while this one is written.
		buf, s.queued = s.queued, buf[:0]
		s.mu.Unlock()
		if _, err := s.f.Write(buf); err != nil {
			s.mu.Lock()
			s.ended = true
			s.queued = nil
			s.mu.Unlock()
			return err
		}
		if cap(buf) > 1<<20 {
			buf = nil // do not keep a burst's buffer for the life of the worker
		}
	}
}
