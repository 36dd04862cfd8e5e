package main

import (
	"bytes"
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/shell/pgtest"
)

// TestBenchMeasuresBothSidesAndChecksThePipeline builds pepsi-bench and
// pepsi-dispatch, as make bench does, and runs one small round on the test
// server: pgbench, then 300 messages through the real dispatcher and three
// workers, checked afterwards (every row done, every hop counted).
func TestBenchMeasuresBothSidesAndChecksThePipeline(t *testing.T) {
	t.Parallel()
	bin := t.TempDir()
	args := []string{"build", "-o", bin + string(filepath.Separator),
		"github.com/pepsi-pipeline/pepsi/cmd/pepsi-bench", "github.com/pepsi-pipeline/pepsi/cmd/pepsi-dispatch"}
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	admin := pgtest.AdminURL(t)
	// A database of this test's own (dropped when the test ends), which the bench
	// drops and creates afresh by name.
	u, err := url.Parse(pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(u.Path, "/")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "pepsi-bench"), "-n", "300", "-rounds", "1",
		"-seconds", "1", "-clients", "2", "-database", admin, "-db-name", name, "-timeout", "2m")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("pepsi-bench: %v; output:\n%s", err, out.String())
	}
	want := regexp.MustCompile(`(?m)^round 1: pgbench 2 clients: [0-9]+ tps.*; pepsi: [0-9]+ hops/s = [0-9.]+× pgbench \(`)
	if !want.MatchString(out.String()) {
		t.Errorf("pepsi-bench output has no line matching %q; output:\n%s", want, out.String())
	}
	if !strings.Contains(out.String(), "median: pgbench 2 clients: ") {
		t.Errorf("pepsi-bench output has no median line; output:\n%s", out.String())
	}
}

func TestBadFlagsExitTwo(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-n", "0"},
		{"-queue-limit", "-1"},
		{"-db-name", "Bad-Name"},
		{"-database", "mysql://x"},
		{"extra"},
	} {
		var stderr bytes.Buffer
		if code := run(context.Background(), args, &bytes.Buffer{}, &stderr); code != 2 {
			t.Errorf("run(%q) = %d, want 2 (stderr: %s)", args, code, stderr.String())
		}
	}
}

func TestTPSIsReadFromPgbenchOutput(t *testing.T) {
	t.Parallel()
	out := "latency average = 1.284 ms\ninitial connection time = 50.053 ms\ntps = 12465.815447 (without initial connection time)\n"
	m := tpsRE.FindStringSubmatch(out)
	if m == nil || m[1] != "12465.815447" {
		t.Errorf("tps parsed from pgbench output = %q, want 12465.815447", m)
	}
}

func TestMedian(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   []float64
		want float64
	}{{[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestPgbenchIsFoundOrNamedWithItsPackage(t *testing.T) {
	t.Parallel()
	p, err := findPgbench()
	if err != nil {
		if !strings.Contains(err.Error(), "postgresql-") {
			t.Errorf("error for a missing pgbench = %q, want it to name the Debian package", err)
		}
		return
	}
	if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
		t.Errorf("findPgbench() = %q, which is not an executable file (%v)", p, err)
	}
}
