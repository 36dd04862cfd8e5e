package conf_test

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core/conf"
)

// FuzzParse feeds arbitrary text to Parse and checks what must hold for every
// input, not only that it returns: the same text always gives the same answer;
// an error is a *conf.Error naming the file and a line of the text; an accepted
// configuration is valid (stage names, programs, positive numbers and
// durations, stages sorted and unique) and survives being written out as
// pepsi.conf text and parsed again unchanged. The seed corpus is
// testdata/fuzz/FuzzParse plus the files below; go test runs it every time.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"../../testdata/demo.conf"} {
		text, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(text))
	}
	f.Add("[stage-a]\nPROGRAM = a\n[stage-b]\nPARALLELISM = 2\n")
	f.Add("[pepsi-dispatch]\nMAX_RUNTIME = 1m30s\nPOLL_INTERVAL = 10\n")
	f.Fuzz(func(t *testing.T, text string) {
		const file = "fuzz.conf"
		c, err := conf.Parse(file, text)
		c2, err2 := conf.Parse(file, text)
		if fmt.Sprint(err) != fmt.Sprint(err2) || !reflect.DeepEqual(c, c2) {
			t.Fatalf("Parse is not deterministic:\nfirst:  %v %+v\nsecond: %v %+v", err, c, err2, c2)
		}
		if err != nil {
			checkError(t, err, file, text)
			return
		}
		checkValid(t, c, file)
		again, err := conf.Parse(file, format(c))
		if err != nil {
			t.Fatalf("the accepted configuration, written out, does not parse: %v\n%s", err, format(c))
		}
		if !reflect.DeepEqual(c, again) {
			t.Fatalf("round trip changed the configuration:\nparsed:  %+v\nwritten: %s\nreparsed: %+v", c, format(c), again)
		}
	})
}

// checkError fails t unless err is a *conf.Error for file whose line is one of
// text's and whose text begins "file:line: ".
func checkError(t *testing.T, err error, file, text string) {
	t.Helper()
	var ce *conf.Error
	if !errors.As(err, &ce) {
		t.Fatalf("error %v (%T) is not a *conf.Error", err, err)
	}
	lines := strings.Count(text, "\n") + 1
	if ce.File != file || ce.Line < 1 || ce.Line > lines {
		t.Fatalf("error %q names %s:%d; want %s and a line in 1..%d", err, ce.File, ce.Line, file, lines)
	}
	if want := fmt.Sprintf("%s:%d: ", file, ce.Line); !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("error %q does not begin with %q", err, want)
	}
}

// checkValid fails t unless c is a configuration the dispatcher can run.
func checkValid(t *testing.T, c *conf.Config, file string) {
	t.Helper()
	d := c.Dispatch
	for _, v := range []time.Duration{d.MaxRuntime, d.IdleTimeout, d.PollInterval, d.StatsInterval, d.StopGrace} {
		if v <= 0 {
			t.Fatalf("a duration is not positive: %+v", d)
		}
	}
	if d.PollInterval < conf.PollIntervalMin {
		t.Fatalf("POLL_INTERVAL %v accepted, under %v", d.PollInterval, conf.PollIntervalMin)
	}
	if d.ConfigFile == "" {
		t.Fatalf("CONFIG_FILE is empty (the default is %q)", file)
	}
	for i, s := range c.Stages {
		if !conf.ValidStageName(s.Name) || s.Program == "" || s.Parallelism < 1 || s.QueueLimit < 1 || s.MaxMessages < 1 {
			t.Fatalf("invalid stage accepted: %+v", s)
		}
		if i > 0 && c.Stages[i-1].Name >= s.Name {
			t.Fatalf("stages not sorted and unique: %q then %q", c.Stages[i-1].Name, s.Name)
		}
		if got, ok := c.Stage(s.Name); !ok || got != s {
			t.Fatalf("Stage(%q) = %+v, %v; want %+v", s.Name, got, ok, s)
		}
	}
}

// format writes c as pepsi.conf text, every key explicit.
func format(c *conf.Config) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[pepsi]\nDATABASE = %s\n", c.Database)
	d := c.Dispatch
	fmt.Fprintf(&b, "[pepsi-dispatch]\nMAX_RUNTIME = %s\nWORKER_IDLE_TIMEOUT = %s\nPOLL_INTERVAL = %s\nSTATS_INTERVAL = %s\nSTOP_GRACE = %s\n",
		d.MaxRuntime, d.IdleTimeout, d.PollInterval, d.StatsInterval, d.StopGrace)
	if d.ConfigFileSet { // else the default, the file itself, as before
		fmt.Fprintf(&b, "CONFIG_FILE = %s\n", d.ConfigFile)
	}
	for _, s := range c.Stages {
		fmt.Fprintf(&b, "[stage-%s]\nPROGRAM = %s\nPARALLELISM = %d\nQUEUE_LIMIT = %d\nMAX_MESSAGES = %d\n",
			s.Name, s.Program, s.Parallelism, s.QueueLimit, s.MaxMessages)
	}
	return b.String()
}

// A line longer than the scanner's buffer is an error like any other: it names
// the file and the line, not only the file.
func TestParseNamesTheLineThatIsTooLong(t *testing.T) {
	text := "[pepsi]\n\n# " + strings.Repeat("x", 2<<20) + "\n"
	_, err := conf.Parse("f.conf", text)
	if err == nil || !strings.HasPrefix(err.Error(), "f.conf:3: ") {
		t.Fatalf("error = %.80v; want one starting with f.conf:3:", err)
	}
}

// Two stages without PROGRAM: the error names the first of them in the file,
// every time (it once depended on map order).
func TestParseMissingProgramErrorIsTheFirstInTheFile(t *testing.T) {
	text := "[stage-b]\n[stage-a]\n[stage-c]\nPROGRAM = c\n[stage-d]\n"
	for range 20 {
		_, err := conf.Parse("f.conf", text)
		if err == nil || !strings.HasPrefix(err.Error(), "f.conf:1: PROGRAM: [stage-b] has no PROGRAM") {
			t.Fatalf("error = %v; want f.conf:1: PROGRAM: [stage-b] has no PROGRAM", err)
		}
	}
}
