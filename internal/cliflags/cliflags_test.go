package cliflags_test

import (
	"bytes"
	"errors"
	"flag"
	"log/slog"
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/internal/cliflags"
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
	_, err := cliflags.Parse(fs, []string{"-max-runtme", "5s"}, "PEPSI")
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
	_, err := cliflags.Parse(fs, []string{"-h"}, "PEPSI")
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

func TestNameSaysWhereTheValueCameFrom(t *testing.T) {
	t.Setenv("PEPSI_MAX_RUNTIME", "-5s")
	for _, tc := range []struct {
		args       []string
		value, who string
	}{
		{nil, "-5s", "PEPSI_MAX_RUNTIME"},
		{[]string{"-max-runtime", "7s"}, "7s", "-max-runtime"},
		{[]string{"-max-runtime=-5s"}, "-5s", "-max-runtime"},
		{[]string{"-standby", "-max-runtime", "7s", "extra"}, "7s", "-max-runtime"},
		{[]string{"-standby", "extra", "-max-runtime", "7s"}, "-5s", "PEPSI_MAX_RUNTIME"}, // after the first argument, not a flag
	} {
		var out bytes.Buffer
		fs, maxRuntime := newFlags(&out)
		p, err := cliflags.Parse(fs, tc.args, "PEPSI")
		if err != nil {
			t.Fatalf("Parse %q: %v", tc.args, err)
		}
		if *maxRuntime != tc.value || p.Name("max-runtime") != tc.who {
			t.Errorf("Parse %q: value %q named %q; want %q named %q", tc.args, *maxRuntime, p.Name("max-runtime"), tc.value, tc.who)
		}
		if got := p.Name("standby"); got != "-standby" {
			t.Errorf("Parse %q: Name(standby) = %q, want -standby (no environment variable sets it)", tc.args, got)
		}
	}
	// Without a prefix the environment is not read, so nothing is named after it.
	var out bytes.Buffer
	fs, maxRuntime := newFlags(&out)
	p, err := cliflags.Parse(fs, nil, "")
	if err != nil || *maxRuntime != "" || p.Name("max-runtime") != "-max-runtime" {
		t.Errorf("Parse without a prefix: %v, value %q named %q; want no error, no value, -max-runtime", err, *maxRuntime, p.Name("max-runtime"))
	}
}

func TestEnvVarIsFFsName(t *testing.T) {
	if got := cliflags.EnvVar("PEPSI", "worker-idle-timeout"); got != "PEPSI_WORKER_IDLE_TIMEOUT" {
		t.Errorf("EnvVar = %q, want PEPSI_WORKER_IDLE_TIMEOUT", got)
	}
}

// -version prints one line and stops like help; only the command line asks for
// it: a PREFIX_VERSION in the environment, whatever its value, changes nothing.
func TestVersionComesFromTheCommandLineOnly(t *testing.T) {
	var out bytes.Buffer
	fs, _ := newFlags(&out)
	if _, err := cliflags.Parse(fs, []string{"-version"}, "PROG"); !errors.Is(err, cliflags.ErrVersion) || !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Parse(-version) = %v; want ErrVersion, a flag.ErrHelp", err)
	}
	if !strings.HasPrefix(out.String(), "prog (PEPSI) ") || strings.Count(out.String(), "\n") != 1 {
		t.Errorf("-version printed %q; want one line starting \"prog (PEPSI) \"", out.String())
	}
	if code := cliflags.Fail(&out, "prog", cliflags.ErrVersion); code != 0 {
		t.Errorf("Fail(ErrVersion) = %d; want 0", code)
	}
	t.Setenv("PROG_VERSION", "1.2.3")
	out.Reset()
	fs, _ = newFlags(&out)
	if _, err := cliflags.Parse(fs, nil, "PROG"); err != nil || out.Len() != 0 {
		t.Errorf("with PROG_VERSION=1.2.3 in the environment: Parse = %v, printed %q; want a normal start", err, out.String())
	}
}

// Database says where a program's database came from (for its start-up
// line), and warns when the environment overrides the configuration file's:
// the log is all an operator has to learn that an exported PEPSI_DATABASE
// redirected the program.
func TestDatabaseSaysWhereItCameFromAndWarnsWhenTheEnvironmentOverridesTheFile(t *testing.T) {
	const file, fileDB = "/etc/pepsi/pepsi.conf", "postgres://pepsi@db/pepsi"
	for _, tc := range []struct {
		name, env string
		args      []string
		fileDB    string
		want      string
		from      string
		warning   []string // empty: no log line
	}{
		{"flag", "", []string{"-database", "postgres://u:secret@other/x"}, fileDB, "postgres://u:secret@other/x", "-database", nil},
		{"environment over the file", "postgres://u:secret@elsewhere/x", nil, fileDB, "postgres://u:secret@elsewhere/x", "PEPSI_DATABASE",
			[]string{"level=WARN", "from=PEPSI_DATABASE", `overrides="/etc/pepsi/pepsi.conf [pepsi] DATABASE"`, "database=postgres://u:xxx@elsewhere/x"}},
		{"environment naming the file's", fileDB, nil, fileDB, fileDB, "PEPSI_DATABASE", nil},
		{"environment, no file", "postgres://u@elsewhere/x", nil, "", "postgres://u@elsewhere/x", "PEPSI_DATABASE", nil},
		{"file", "", nil, fileDB, fileDB, "/etc/pepsi/pepsi.conf [pepsi] DATABASE", nil},
		{"libpq", "", nil, "", "", "the libpq environment (PGHOST, PGDATABASE, ...): no -database, PEPSI_DATABASE nor [pepsi] DATABASE", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PEPSI_DATABASE", tc.env)
			fs := flag.NewFlagSet("prog", flag.ContinueOnError)
			database := fs.String("database", "", "the database")
			p, err := cliflags.Parse(fs, tc.args, "PEPSI")
			if err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			got, from := p.Database(slog.New(slog.NewTextHandler(&logs, nil)), *database, file, tc.fileDB)
			if got != tc.want || from != tc.from {
				t.Errorf("database %q from %q; want %q from %q", got, from, tc.want, tc.from)
			}
			if len(tc.warning) == 0 && logs.Len() > 0 {
				t.Errorf("logged %q; want nothing", logs.String())
			}
			for _, want := range tc.warning {
				if !strings.Contains(logs.String(), want) {
					t.Errorf("log %q; want it to contain %q", logs.String(), want)
				}
			}
			if strings.Contains(logs.String(), "secret") {
				t.Errorf("log %q shows the password", logs.String())
			}
		})
	}
	for in, want := range map[string]string{
		"postgres://u:secret@h/db?password=also": "postgres://u:xxx@h/db?password=xxx",
		"host=h password=secret user=u":          "host=h password=xxx user=u",
		"postgres://u@h/db":                      "postgres://u@h/db",
		// libpq allows blanks around '=' and quoted values with blanks.
		"host=h password = secret user=u":           "host=h password=xxx user=u",
		"host=h password='a secret b' dbname='x y'": "host=h password=xxx dbname='x y'",
		`host=h password='it\'s secret' user=u`:     "host=h password=xxx user=u",
		"host=h password=sec\\ ret user=u":          "host=h password=xxx user=u",
		"host=h password='unterminated secret":      "(a connection string that cannot be read; not shown, as it may hold a password)",
		"postgres://u:sec#ret@h/db":                 "(a connection string that cannot be read; not shown, as it may hold a password)",
		"postgres://u:123?secret@h/db":              "(a connection string that cannot be read; not shown, as it may hold a password)",
		"postgres://u:4321/secret@h/db":             "(a connection string that cannot be read; not shown, as it may hold a password)",
		"postgresql://u:secret@h/db":                "postgresql://u:xxx@h/db",
		"":                                          "",
	} {
		if got := cliflags.Redact(in); got != want {
			t.Errorf("Redact(%q) = %q; want %q", in, got, want)
		}
	}
}
