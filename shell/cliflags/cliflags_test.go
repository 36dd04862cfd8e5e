package cliflags_test

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/shell/cliflags"
)

func newFlags(out *bytes.Buffer) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet("prog", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() { out.WriteString("usage: prog [flags]\n"); fs.PrintDefaults() }
	maxRuntime := fs.String("max-runtime", "", "how long")
	fs.Bool("standby", false, "wait")
	return fs, maxRuntime
}

func TestAMistakeIsOneLineAndAPointerToTheHelp(t *testing.T) {
	var out bytes.Buffer
	fs, _ := newFlags(&out)
	err := cliflags.Parse(fs, []string{"-max-runtme", "5s"}, "PEPSI")
	if err == nil || err.Error() != "flag provided but not defined: -max-runtme" {
		t.Fatalf("Parse = %v; want the flag package's error alone", err)
	}
	if out.Len() != 0 {
		t.Errorf("Parse printed %q on a mistake; want nothing (the caller prints one line)", out.String())
	}
	var w bytes.Buffer
	if code := cliflags.Fail(&w, "prog", err); code != cliflags.ExitUsage {
		t.Errorf("Fail = %d, want %d", code, cliflags.ExitUsage)
	}
	if want := "prog: flag provided but not defined: -max-runtme\nRun 'prog -h' for help.\n"; w.String() != want {
		t.Errorf("Fail wrote %q, want %q", w.String(), want)
	}
}

func TestHelpPrintsTheWholeUsage(t *testing.T) {
	var out bytes.Buffer
	fs, _ := newFlags(&out)
	err := cliflags.Parse(fs, []string{"-h"}, "PEPSI")
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Parse -h = %v, want flag.ErrHelp", err)
	}
	if !strings.HasPrefix(out.String(), "usage: prog [flags]\n") || !strings.Contains(out.String(), "-max-runtime") {
		t.Errorf("-h printed %q; want the usage and every flag", out.String())
	}
	var w bytes.Buffer
	if code := cliflags.Fail(&w, "prog", err); code != 0 || w.Len() != 0 {
		t.Errorf("Fail(ErrHelp) = %d and %q; want 0 and nothing more", code, w.String())
	}
}
