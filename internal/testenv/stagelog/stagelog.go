// Package stagelog is the record the test stage program
// (internal/testenv/teststage) writes of what it did, one JSON line per
// event, and the tests that run it read back. It is test infrastructure; no
// program of the product uses it.
package stagelog

import "time"

// Record is one line of the record file.
type Record struct {
	At          time.Time `json:"at"`
	PID         int       `json:"pid"`
	Stage       string    `json:"stage"`
	Ev          string    `json:"ev"`
	Args        []string  `json:"args,omitempty"`
	Env         string    `json:"env,omitempty"`
	IDs         []int64   `json:"ids,omitempty"`
	Outstanding int       `json:"outstanding,omitempty"`
	ID          int64     `json:"id,omitempty"`
	Pass        int       `json:"pass,omitempty"`
}
