package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/shell/dispatch"
)

func TestAMistypedFlagIsOneLineAndAPointerToTheHelp(t *testing.T) {
	var stderr bytes.Buffer
	if code := run([]string{"-max-runtme", "5s"}, &stderr); code != dispatch.ExitUsage {
		t.Errorf("exit %d, want %d", code, dispatch.ExitUsage)
	}
	want := "pepsi-dispatch: flag provided but not defined: -max-runtme\nRun 'pepsi-dispatch -h' for help.\n"
	if stderr.String() != want {
		t.Errorf("stderr:\n%s\nwant:\n%s", stderr.String(), want)
	}
	stderr.Reset()
	if code := run([]string{"-h"}, &stderr); code != 0 || !strings.Contains(stderr.String(), "Usage: pepsi-dispatch [flags]") ||
		!strings.Contains(stderr.String(), "-worker-idle-timeout") {
		t.Errorf("-h: exit %d, stderr %q; want 0 and the whole help", code, stderr.String())
	}
}
