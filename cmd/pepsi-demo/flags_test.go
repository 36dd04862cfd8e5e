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
