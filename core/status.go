package core

import (
	"fmt"
	"github.com/pepsi-pipeline/pepsi/core/conf"
	"strconv"
	"strings"
)

// reasonMax bounds a failure reason written to state.dispatch_error.
const reasonMax = 2000

// Status is a parsed worker status line.
type Status struct {
	// Code is 0 for success; anything else means the message failed.
	Code int
	// Reason is the text after a non-zero code (may be empty).
	Reason string
	// Fused lists stages fused into a successful pass, in the order given.
	Fused []Fused
}

// Fused is one stage fused into another stage's pass and the time it took.
type Fused struct {
	Stage  string
	Micros int64
}

// ParseStatus parses one status line of the worker protocol: "0", "0 STAGE:MICROS…"
// or "N REASON…" with N a non-zero integer. Anything else is an error quoting the
// line; the dispatcher treats it as a protocol error.
func ParseStatus(line string) (Status, error) {
	head, rest, _ := strings.Cut(line, " ")
	code, err := strconv.Atoi(head)
	if err != nil || head == "" || head[0] == '+' {
		return Status{}, fmt.Errorf("status line %q does not start with an integer code", clip(line, 200))
	}
	if code != 0 {
		return Status{Code: code, Reason: clip(strings.TrimSpace(rest), reasonMax)}, nil
	}
	var s Status
	for _, f := range strings.Fields(rest) {
		name, micros, ok := strings.Cut(f, ":")
		us, err := strconv.ParseInt(micros, 10, 64)
		if !ok || err != nil || us < 0 || !conf.ValidStageName(name) {
			return Status{}, fmt.Errorf("status line %q: %q is not STAGE:MICROS", clip(line, 200), clip(f, 100))
		}
		s.Fused = append(s.Fused, Fused{Stage: name, Micros: us})
	}
	return s, nil
}

// clip cuts s to at most n bytes without splitting a UTF-8 sequence.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}
