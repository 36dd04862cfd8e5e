package main

import (
	"testing"
	"time"
)

// TestDueInSaysWhenATimeComes: a time past is due, one ahead is "in" its
// distance, rounded, and one past what a time.Duration holds (292 years) is
// said in years, not as the Duration's largest value.
func TestDueInSaysWhenATimeComes(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		at   time.Time
		want string
	}{
		{now.Add(-time.Minute), "due"},
		{now.Add(400 * time.Microsecond), "due"},
		{now.Add(90*time.Minute + 1500*time.Microsecond), "in 1h30m0.002s"},
		{time.Date(2400, 1, 1, 0, 0, 0, 0, time.UTC), "in about 374 years"},
	} {
		if got := dueIn(tc.at, now, time.Millisecond); got != tc.want {
			t.Errorf("dueIn(%s) = %q; want %q", tc.at, got, tc.want)
		}
	}
}
