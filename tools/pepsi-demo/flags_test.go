package main

import (
	"bytes"
	"context"
	"testing"
)

func TestDemoRejectsABadCommandLine(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"-n", "0"}, {"-db-name", "Robert'); DROP"}, {"extra"}} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), args, &stdout, &stderr); code != 2 {
			t.Errorf("pepsi-demo %q: exit %d, want 2 (stderr %q)", args, code, stderr.String())
		}
	}
}

func TestDemoSaysAMistypedFlagInOneLine(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"-bogus"}, &stdout, &stderr)
	if want := "pepsi-demo: flag provided but not defined: -bogus\nRun 'pepsi-demo -h' for help.\n"; code != 2 || stderr.String() != want {
		t.Errorf("pepsi-demo -bogus: exit %d, stderr %q; want 2 and %q (not the whole help)", code, stderr.String(), want)
	}
}
