// Package lockedbuf is a bytes.Buffer that goroutines may write while a test
// reads it: where a logger, a server or a process's output and the test that
// checks them share one buffer. It is test infrastructure; no program uses it.
package lockedbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer whose Write and String may be called from any
// goroutine. The zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
