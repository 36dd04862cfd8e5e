package stage

import (
	"testing"
	"time"
)

// A "paused:SECONDS" target is decimal seconds to the microsecond, without an
// exponent or trailing zeros; a pause in the past is 0.
func TestSecondsOfAPausedTarget(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0"},
		{-time.Hour, "0"},
		{400 * time.Nanosecond, "0"},
		{time.Microsecond, "0.000001"},
		{1500 * time.Millisecond, "1.5"},
		{1234567 * time.Nanosecond, "0.001235"},
		{time.Second, "1"},
		{10 * time.Second, "10"},
		{time.Hour, "3600"},
		{100*24*time.Hour + 250*time.Millisecond, "8640000.25"},
	} {
		if got := seconds(c.d); got != c.want {
			t.Errorf("seconds(%v) = %q, want %q", c.d, got, c.want)
		}
	}
}
