package main

import (
	"bytes"
	"math"
	"os"
	"strings"
	"testing"
)

func TestSlopeIsTheLeastSquaresSlopePerMinute(t *testing.T) {
	var flat, rising []sample
	for m := 1; m <= 10; m++ {
		flat = append(flat, sample{minute: m, done: 600})
		rising = append(rising, sample{minute: m, done: int64(100 + 7*m)})
	}
	done := func(x sample) float64 { return float64(x.done) }
	if s := slope(flat, done); s != 0 {
		t.Errorf("slope of a flat series = %v, want 0", s)
	}
	if s := slope(rising, done); math.Abs(s-7) > 1e-9 {
		t.Errorf("slope of 100+7m = %v, want 7", s)
	}
}

func TestReportComparesTheFirstAndLastFiveMinutes(t *testing.T) {
	var xs []sample
	for m := 1; m <= 12; m++ {
		d := int64(1000)
		if m > 7 {
			d = 800
		}
		xs = append(xs, sample{minute: m, done: d, rss: 20 << 10})
	}
	var out bytes.Buffer
	if err := (&soak{out: &out}).report(xs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "last/first = 0.800") || !strings.Contains(out.String(), "RSS MB     first 5 min 20.0, last 5 min 20.0") {
		t.Errorf("report:\n%s", out.String())
	}
}

func TestProcStatusReadsRSSAndThreadsOfThisProcess(t *testing.T) {
	rss, threads := procStatus(os.Getpid())
	if rss <= 0 || threads <= 0 || countFDs(os.Getpid()) <= 0 {
		t.Errorf("rss %d kB, threads %d, fds %d: want all positive", rss, threads, countFDs(os.Getpid()))
	}
}
