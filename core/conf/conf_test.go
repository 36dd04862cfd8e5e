package conf_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core/conf"
)

// A byte order mark that an editor wrote at the start is no part of the
// first line.
func TestAByteOrderMarkIsNotPartOfTheFirstLine(t *testing.T) {
	c, err := conf.Parse("f.conf", "\uFEFF[stage-a]\nPROGRAM = a\n")
	if err != nil || len(c.Stages) != 1 || c.Stages[0].Name != "a" {
		t.Errorf("Parse of a file starting with a BOM = %v, %v; want stage a", c, err)
	}
}

func TestParseReadsEveryKeyAndAppliesDefaults(t *testing.T) {
	c, err := conf.Parse("/etc/pepsi/pepsi.conf", `
# comment
; another comment
[pepsi]
DATABASE = postgres://db/pepsi

[pepsi-dispatch]
MAX_RUNTIME = 1m30s
WORKER_IDLE_TIMEOUT = 250ms
POLL_INTERVAL = 10

[stage-parse]
PROGRAM = /usr/lib/pepsi/parse
PARALLELISM = 8
QUEUE_LIMIT = 16
MAX_MESSAGES = 50

[stage-deliver]
PROGRAM = deliver
`)
	if err != nil {
		t.Fatal(err)
	}
	if c.Database != "postgres://db/pepsi" {
		t.Errorf("Database = %q", c.Database)
	}
	d := c.Dispatch
	if d.MaxRuntime != 90*time.Second || d.IdleTimeout != 250*time.Millisecond || d.PollInterval != 10*time.Second {
		t.Errorf("durations: %+v", d)
	}
	if d.StatsInterval != conf.DefaultStatsInterval || d.StopGrace != conf.DefaultStopGrace || !d.Vacuum {
		t.Errorf("defaults not applied: %+v", d)
	}
	for text, want := range map[string]bool{"off": false, "OFF": false, "no": false, "0": false, "on": true, "yes": true} {
		c, err := conf.Parse("v.conf", "[pepsi-dispatch]\nVACUUM = "+text+"\n")
		if err != nil || c.Dispatch.Vacuum != want {
			t.Errorf("VACUUM = %s: %v, %v; want %v", text, c.Dispatch.Vacuum, err, want)
		}
	}
	if d.ConfigFile != "/etc/pepsi/pepsi.conf" {
		t.Errorf("CONFIG_FILE defaults to the file parsed, got %q", d.ConfigFile)
	}
	if len(c.Stages) != 2 || c.Stages[0].Name != "deliver" || c.Stages[1].Name != "parse" {
		t.Fatalf("stages not sorted by name: %+v", c.Stages)
	}
	del, _ := c.Stage("deliver")
	if del.Parallelism != 4 || del.QueueLimit != 4 || del.MaxMessages != 1000 {
		t.Errorf("stage defaults: %+v", del)
	}
	p, ok := c.Stage("parse")
	if !ok || p.Program != "/usr/lib/pepsi/parse" || p.Parallelism != 8 || p.QueueLimit != 16 || p.MaxMessages != 50 {
		t.Errorf("parse: %+v", p)
	}
	if _, ok := c.Stage("nope"); ok {
		t.Errorf("Stage found a stage that is not configured")
	}
}

// [pepsi-httpd]: the page's actions are off unless ACTIONS = on, which
// comes with the tokens that may act.
func TestParseReadsTheHttpdSection(t *testing.T) {
	c, err := conf.Parse("f.conf", "[stage-a]\nPROGRAM = a\n")
	if err != nil || c.Httpd.Actions || c.Httpd.TokensFile != "" {
		t.Fatalf("no [pepsi-httpd]: %+v, %v; want actions off", c.Httpd, err)
	}
	c, err = conf.Parse("f.conf", "[pepsi-httpd]\nACTIONS = on\nTOKENS_FILE = /etc/pepsi/operators\n")
	if err != nil || !c.Httpd.Actions || c.Httpd.TokensFile != "/etc/pepsi/operators" {
		t.Fatalf("ACTIONS = on with TOKENS_FILE: %+v, %v", c.Httpd, err)
	}
}

// Proves: PROGRAM is a bare name (looked up on PATH) or an absolute path, kept
// as written; a relative path with a slash is refused (see
// TestParseErrorsNameFileLineAndKey), since it would depend on the
// dispatcher's working directory.
func TestProgramIsABareNameOrAnAbsolutePath(t *testing.T) {
	for _, program := range []string{"parse", "pepsi-example", "stage.py", "/usr/lib/pepsi/parse", "/opt/stages/../bin/x"} {
		c, err := conf.Parse("f.conf", "[stage-a]\nPROGRAM = "+program+"\n")
		if err != nil {
			t.Errorf("PROGRAM = %s: %v; want it accepted", program, err)
			continue
		}
		if got := c.Stages[0].Program; got != program {
			t.Errorf("PROGRAM = %s: got %q, want it as written", program, got)
		}
	}
}

func TestParseErrorsNameFileLineAndKey(t *testing.T) {
	cases := []struct {
		name, text, want string
	}{
		{"unknown section", "[stage-a]\nPROGRAM = a\n[bogus]\n", "f.conf:3: unknown section [bogus]"},
		{"unknown key", "[pepsi-dispatch]\nMAX_RUNTIME = 5\nMAX_RUNTME = 5\n", "f.conf:3: MAX_RUNTME: unknown key"},
		{"unknown key that looks known", "[pepsi-dispatch]\nMAX_RUNTIME\u200b = 5\n", "f.conf:2: 'MAX_RUNTIME\\u200b': unknown key in [pepsi-dispatch]"},
		{"unknown key with a control character", "[stage-a]\nPROGRAM = a\nQUEUE\x1b[2K_LIMIT = 5\n", "f.conf:3: 'QUEUE\\x1b[2K_LIMIT': unknown key"},
		{"bad duration", "[pepsi-dispatch]\nPOLL_INTERVAL = soon\n", "f.conf:2: POLL_INTERVAL: 'soon' is not whole seconds"},
		{"zero duration", "[pepsi-dispatch]\nPOLL_INTERVAL = 0\n", "f.conf:2: POLL_INTERVAL: '0' must be positive"},
		{"poll interval too short", "[pepsi-dispatch]\nPOLL_INTERVAL = 9ms\n", "f.conf:2: POLL_INTERVAL: '9ms' is too short (at least 10ms"},
		{"bad number", "[stage-a]\nPROGRAM = a\nPARALLELISM = -1\n", "f.conf:3: PARALLELISM: '-1' is not a positive whole number"},
		{"count past an int64", "[stage-a]\nPROGRAM = a\nQUEUE_LIMIT = 99999999999999999999\n", "f.conf:3: QUEUE_LIMIT: '99999999999999999999' is larger than 1000000"},
		{"negative count past an int64", "[stage-a]\nPROGRAM = a\nQUEUE_LIMIT = -99999999999999999999\n", "f.conf:3: QUEUE_LIMIT: '-99999999999999999999' is not a positive whole number"},
		{"MAX_PENDING past an int64", "[stage-a]\nPROGRAM = a\nMAX_PENDING = 99999999999999999999\n", "f.conf:3: MAX_PENDING: '99999999999999999999' is larger than 1000000000"},
		{"missing program", "[stage-a]\nPARALLELISM = 2\n", "f.conf:1: PROGRAM: [stage-a] has no PROGRAM"},
		{"empty program", "[stage-a]\nPROGRAM =\n", "f.conf:2: PROGRAM: must not be empty"},
		{"relative program path", "[stage-a]\nPARALLELISM = 2\nPROGRAM = sub/prog\n", "f.conf:3: PROGRAM: 'sub/prog' is a relative path: a path must be absolute (a bare name is looked up on PATH)"},
		{"dot-slash program", "[stage-a]\nPROGRAM = ./stage.py\n", "f.conf:2: PROGRAM: './stage.py' is a relative path: a path must be absolute (a bare name is looked up on PATH)"},
		{"duplicate key", "[stage-a]\nPROGRAM = a\nPROGRAM = b\n", "f.conf:3: PROGRAM: set twice in [stage-a] (first at line 2)"},
		{"duplicate section", "[stage-a]\nPROGRAM = a\n[stage-a]\n", "f.conf:3: section [stage-a] appears twice"},
		{"duplicate [pepsi-dispatch]", "[pepsi-dispatch]\nMAX_RUNTIME = 5\n[pepsi-dispatch]\nPOLL_INTERVAL = 5\n", "f.conf:3: section [pepsi-dispatch] appears twice (first at line 1)"},
		{"duplicate [pepsi]", "[pepsi]\n[stage-a]\nPROGRAM = a\n[pepsi]\n", "f.conf:4: section [pepsi] appears twice (first at line 1)"},
		{"duration text over a year", "[pepsi-dispatch]\nMAX_RUNTIME = 100000h\n", "f.conf:2: MAX_RUNTIME: '100000h' is too long"},
		{"duration text past time.Duration", "[pepsi-dispatch]\nMAX_RUNTIME = 9999999h\n", "f.conf:2: MAX_RUNTIME: '9999999h' is too long (at most a year)"},
		{"seconds past an int64", "[pepsi-dispatch]\nSTOP_GRACE = 99999999999999999999\n", "f.conf:2: STOP_GRACE: '99999999999999999999' is too long (at most a year)"},
		{"negative seconds past an int64", "[pepsi-dispatch]\nSTOP_GRACE = -99999999999999999999\n", "f.conf:2: STOP_GRACE: '-99999999999999999999' must be positive"},
		{"signed duration text past time.Duration", "[pepsi-dispatch]\nSTOP_GRACE = +9999999h\n", "f.conf:2: STOP_GRACE: '+9999999h' is too long"},
		{"negative duration text past time.Duration", "[pepsi-dispatch]\nSTOP_GRACE = -9999999h\n", "f.conf:2: STOP_GRACE: '-9999999h' must be positive"},
		{"micro sign duration past time.Duration", "[pepsi-dispatch]\nSTOP_GRACE = 99999999999999999999\u03bcs\n", "f.conf:2: STOP_GRACE: '99999999999999999999\u03bcs' is too long"},
		{"two signs", "[pepsi-dispatch]\nSTOP_GRACE = +-5s\n", "f.conf:2: STOP_GRACE: '+-5s' is not whole seconds nor a duration"},
		{"a unit that is none", "[pepsi-dispatch]\nSTOP_GRACE = 5 parsecs\n", "f.conf:2: STOP_GRACE: '5 parsecs' is not whole seconds"},
		{"history kept past 3650 days", "[pepsi-dispatch]\nHISTORY_KEEP = 87601h\n", "f.conf:2: HISTORY_KEEP: '87601h' is too long (at most 3650 days)"},
		{"key outside section", "DATABASE = x\n", "f.conf:1: DATABASE: key outside any section"},
		{"NUL in a value", "[stage-a]\nPROGRAM = /opt/a\x00b\n", "f.conf:2: PROGRAM: the value holds a NUL byte"},
		{"no equals", "[pepsi]\nDATABASE\n", "f.conf:2: want KEY = value"},
		{"bad stage name", "[stage-a b]\nPROGRAM = a\n", "f.conf:1: stage name 'a b'"},
		{"bad switch", "[pepsi-dispatch]\nVACUUM = sometimes\n", "f.conf:2: VACUUM: 'sometimes' is not on or off"},
		{"reserved stage name", "[pepsi-dispatch]\n[stage-done]\nPROGRAM = a\n", "f.conf:2: stage name 'done' is reserved"},
		{"reserved stage name paused", "[pepsi-dispatch]\n\n[stage-paused]\nPROGRAM = a\n", "f.conf:3: stage name 'paused' is reserved"},
		{"unclosed header", "[pepsi\n", "f.conf:1: section header"},
		{"negative retry limit", "[stage-a]\nPROGRAM = a\nRETRY_LIMIT = -1\n", "f.conf:3: RETRY_LIMIT: '-1' is not a whole number from 0 to 1000"},
		{"retry limit not a number", "[stage-a]\nPROGRAM = a\nRETRY_LIMIT = often\n", "f.conf:3: RETRY_LIMIT: 'often' is not a whole number"},
		{"zero retry delay", "[stage-a]\nPROGRAM = a\nRETRY_DELAY = 0\n", "f.conf:3: RETRY_DELAY: '0' must be positive"},
		{"bad retry delay max", "[stage-a]\nPROGRAM = a\nRETRY_DELAY_MAX = later\n", "f.conf:3: RETRY_DELAY_MAX: 'later' is not whole seconds"},
		{"retry delay max below delay", "[stage-a]\nPROGRAM = a\nRETRY_DELAY = 10s\n\nRETRY_DELAY_MAX = 5s\n", "f.conf:5: RETRY_DELAY_MAX: RETRY_DELAY_MAX 5s is below RETRY_DELAY 10s"},
		{"retry delay above default max", "[stage-a]\nPROGRAM = a\nRETRY_DELAY = 10m\n", "f.conf:3: RETRY_DELAY: RETRY_DELAY_MAX 5m0s is below RETRY_DELAY 10m0s"},
		{"zero rate", "[stage-a]\nPROGRAM = a\nRATE = 0\n", "f.conf:3: RATE: '0' is not a positive decimal number"},
		{"word rate", "[stage-a]\nPROGRAM = a\nRATE = fast\n", "f.conf:3: RATE: 'fast' is not a positive decimal number"},
		{"negative emit max", "[stage-a]\nPROGRAM = a\nEMIT_MAX = -1\n", "f.conf:3: EMIT_MAX: '-1' is not a whole number from 0 to 100000"},
		{"emit max too large", "[stage-a]\nPROGRAM = a\nEMIT_MAX = 100001\n", "f.conf:3: EMIT_MAX: '100001' is not a whole number from 0 to 100000"},
		{"negative rate", "[stage-a]\nPROGRAM = a\nRATE = -5\n", "f.conf:3: RATE: '-5' is not a positive decimal number"},
		{"exponent rate", "[stage-a]\nPROGRAM = a\nRATE = 1e3\n", "f.conf:3: RATE: '1e3' is not a positive decimal number"},
		{"infinite rate", "[stage-a]\nPROGRAM = a\nRATE = Inf\n", "f.conf:3: RATE: 'Inf' is not a positive decimal number"},
		{"tiny rate", "[stage-a]\nPROGRAM = a\nRATE = 0.0001\n", "f.conf:3: RATE: '0.0001' is less than 0.001"},
		{"huge rate", "[stage-a]\nPROGRAM = a\nRATE = 2000000\n", "f.conf:3: RATE: '2000000' is more than 1000000"},
		{"bad input", "[stage-a]\nPROGRAM = a\nINPUT = json\n", "f.conf:3: INPUT: 'json' is neither id nor message"},
		{"bad stage max runtime", "[stage-a]\nPROGRAM = a\n\nMAX_RUNTIME = forever\n", "f.conf:4: MAX_RUNTIME: 'forever' is not whole seconds"},
		{"zero stage max runtime", "[stage-a]\nPROGRAM = a\nMAX_RUNTIME = 0\n", "f.conf:3: MAX_RUNTIME: '0' must be positive"},
		{"small line max", "[pepsi-dispatch]\nLINE_MAX = 100\n", "f.conf:2: LINE_MAX: '100' is not a whole number of bytes from 1024 to 1073741824"},
		{"no sessions", "[pepsi-dispatch]\nSESSIONS = 0\n", "f.conf:2: SESSIONS: '0' is not a whole number of sessions from 1 to 16"},
		{"too many sessions", "[pepsi-dispatch]\nSESSIONS = 17\n", "f.conf:2: SESSIONS: '17' is not a whole number of sessions from 1 to 16"},
		{"sessions not a number", "[pepsi-dispatch]\nSESSIONS = two\n", "f.conf:2: SESSIONS: 'two' is not a whole number of sessions from 1 to 16"},
		{"httpd actions without tokens", "[pepsi-httpd]\n\nACTIONS = on\n", "f.conf:3: ACTIONS: on without TOKENS_FILE"},
		{"httpd actions not a switch", "[pepsi-httpd]\nACTIONS = sometimes\n", "f.conf:2: ACTIONS: 'sometimes' is not on or off"},
		{"httpd unknown key", "[pepsi-httpd]\nLISTEN = :80\n", "f.conf:2: LISTEN: unknown key in [pepsi-httpd] (want ACTIONS or TOKENS_FILE)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := conf.Parse("f.conf", tc.text)
			if err == nil {
				t.Fatalf("Parse accepted %q", tc.text)
			}
			if !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("error %q\nwant it to start with %q", err, tc.want)
			}
		})
	}
}

func TestParseReadsRetryAndRateKeys(t *testing.T) {
	c, err := conf.Parse("r.conf", `
[stage-call]
PROGRAM = call
RETRY_LIMIT = 5
RETRY_DELAY = 250ms
RETRY_DELAY_MAX = 1m
RATE = 2.5
EMIT_MAX = 7

[stage-plain]
PROGRAM = plain
`)
	if err != nil {
		t.Fatal(err)
	}
	call, _ := c.Stage("call")
	if call.RetryLimit != 5 || call.RetryDelay != 250*time.Millisecond || call.RetryDelayMax != time.Minute || call.Rate != 2.5 || call.EmitMax != 7 {
		t.Errorf("call: %+v", call)
	}
	plain, _ := c.Stage("plain")
	if plain.RetryLimit != 0 || plain.RetryDelay != time.Second || plain.RetryDelayMax != 300*time.Second || plain.Rate != 0 || plain.EmitMax != conf.DefaultEmitMax {
		t.Errorf("defaults: %+v", plain)
	}
	for _, in := range []string{"50", "0.5", ".25", "1000000"} {
		if _, err := conf.ParseRate(in); err != nil {
			t.Errorf("ParseRate(%q): %v", in, err)
		}
	}
}

func TestParseReadsAStagesOwnMaxRuntime(t *testing.T) {
	c, err := conf.Parse("m.conf", `
[pepsi-dispatch]
MAX_RUNTIME = 30

[stage-parse]
PROGRAM = parse
MAX_RUNTIME = 250ms

[stage-deliver]
PROGRAM = deliver
`)
	if err != nil {
		t.Fatal(err)
	}
	parse, _ := c.Stage("parse")
	deliver, _ := c.Stage("deliver")
	if parse.MaxRuntime != 250*time.Millisecond || deliver.MaxRuntime != 0 {
		t.Errorf("parse %s, deliver %s; want 250ms and 0 (the dispatcher's)", parse.MaxRuntime, deliver.MaxRuntime)
	}
	if got := c.Dispatch.RuntimeOf(parse); got != 250*time.Millisecond {
		t.Errorf("RuntimeOf(parse) = %s; want the stage's 250ms", got)
	}
	if got := c.Dispatch.RuntimeOf(deliver); got != 30*time.Second {
		t.Errorf("RuntimeOf(deliver) = %s; want the dispatcher's 30s", got)
	}
	// A flag that overrides the dispatcher's MAX_RUNTIME after the parse moves
	// the stages that have none of their own, and only those.
	c.Dispatch.MaxRuntime = time.Minute
	if c.Dispatch.RuntimeOf(deliver) != time.Minute || c.Dispatch.RuntimeOf(parse) != 250*time.Millisecond {
		t.Errorf("after an override: deliver %s, parse %s", c.Dispatch.RuntimeOf(deliver), c.Dispatch.RuntimeOf(parse))
	}
}

func TestParseReadsInputAndLineMax(t *testing.T) {
	c, err := conf.Parse("i.conf", `
[pepsi-dispatch]
LINE_MAX = 65536

[stage-filter]
PROGRAM = filter
INPUT = message

[stage-reader]
PROGRAM = reader
INPUT = id

[stage-plain]
PROGRAM = plain
`)
	if err != nil {
		t.Fatal(err)
	}
	if c.Dispatch.LineMax != 65536 {
		t.Errorf("LineMax = %d; want 65536", c.Dispatch.LineMax)
	}
	for name, want := range map[string]conf.Input{"filter": conf.InputMessage, "reader": conf.InputID, "plain": conf.InputID} {
		if s, _ := c.Stage(name); s.Input != want {
			t.Errorf("stage %s: Input = %q; want %q", name, s.Input, want)
		}
	}
	d, err := conf.Parse("d.conf", "")
	if err != nil || d.Dispatch.LineMax != conf.DefaultLineMax {
		t.Errorf("LINE_MAX default: %d, %v; want %d", d.Dispatch.LineMax, err, conf.DefaultLineMax)
	}
}

func TestParseReadsSessions(t *testing.T) {
	c, err := conf.Parse("s.conf", "[pepsi-dispatch]\nSESSIONS = 3\n[stage-a]\nPROGRAM = a\n")
	if err != nil || c.Dispatch.Sessions != 3 {
		t.Fatalf("SESSIONS = 3: %d, %v", c.Dispatch.Sessions, err)
	}
	d, err := conf.Parse("d.conf", "")
	if err != nil || d.Dispatch.Sessions != conf.DefaultSessions {
		t.Errorf("SESSIONS default: %d, %v; want %d", d.Dispatch.Sessions, err, conf.DefaultSessions)
	}
}

func TestParseDurationTakesSecondsOrGoDurations(t *testing.T) {
	for in, want := range map[string]time.Duration{"30": 30 * time.Second, "250ms": 250 * time.Millisecond, "1m30s": 90 * time.Second} {
		if got, err := conf.ParseDuration(in); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-5", "0s", "5 s", "1e3"} {
		if _, err := conf.ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q) accepted", in)
		}
	}
}

func TestParseReadsTheIngressSection(t *testing.T) {
	c, err := conf.Parse("f.conf", "[pepsi]\nDATABASE = x\n")
	if err != nil {
		t.Fatal(err)
	}
	if in := c.Ingress; in.Listen != "127.0.0.1:8180" || in.MaxBody != 16<<20 || in.MaxPending != 0 || in.TokensFile != "" || in.TLSCert != "" {
		t.Errorf("[pepsi-ingress] defaults: %+v", in)
	}
	c, err = conf.Parse("f.conf", `[pepsi-ingress]
LISTEN = 0.0.0.0:443
TOKENS_FILE = /etc/pepsi/tokens
TLS_CERT = /etc/pepsi/cert.pem
TLS_KEY = /etc/pepsi/key.pem
MAX_BODY = 1048576
MAX_PENDING = 50000
`)
	if err != nil {
		t.Fatal(err)
	}
	want := conf.Ingress{Listen: "0.0.0.0:443", TokensFile: "/etc/pepsi/tokens", TLSCert: "/etc/pepsi/cert.pem",
		TLSKey: "/etc/pepsi/key.pem", MaxBody: 1 << 20, MaxPending: 50000}
	if c.Ingress != want {
		t.Errorf("[pepsi-ingress] = %+v\nwant %+v", c.Ingress, want)
	}
}

func TestParseRefusesABadIngressSection(t *testing.T) {
	cases := []struct {
		name, text, want string
	}{
		{"open listener without tokens", "[pepsi-ingress]\n\nLISTEN = 0.0.0.0:8180\n", `f.conf:3: LISTEN: '0.0.0.0:8180' is not a loopback address, and there is no TOKENS_FILE`},
		{"every interface without tokens", "[pepsi-ingress]\nLISTEN = :8180\n", `f.conf:2: LISTEN: ':8180' is not a loopback address`},
		{"host name without tokens", "[pepsi-ingress]\nLISTEN = ingress.example.org:8180\n", `f.conf:2: LISTEN: 'ingress.example.org:8180' is not a loopback`},
		{"no port", "[pepsi-ingress]\nLISTEN = 127.0.0.1\n", `f.conf:2: LISTEN: '127.0.0.1' is not host:port`},
		{"bad port", "[pepsi-ingress]\nLISTEN = 127.0.0.1:http\n", `f.conf:2: LISTEN: '127.0.0.1:http' is not host:port`},
		{"cert without key", "[pepsi-ingress]\nTLS_CERT = c.pem\n", "f.conf:2: TLS_CERT: set without TLS_KEY"},
		{"key without cert", "[pepsi-ingress]\n#\nTLS_KEY = k.pem\n", "f.conf:3: TLS_KEY: set without TLS_CERT"},
		{"zero body", "[pepsi-ingress]\nMAX_BODY = 0\n", `f.conf:2: MAX_BODY: '0' is not a positive whole number`},
		{"huge body", "[pepsi-ingress]\nMAX_BODY = 2000000000\n", `f.conf:2: MAX_BODY: '2000000000' is larger than 1073741824`},
		{"bad pending", "[pepsi-ingress]\nMAX_PENDING = many\n", `f.conf:2: MAX_PENDING: 'many' is not a positive whole number`},
		{"empty tokens file", "[pepsi-ingress]\nTOKENS_FILE =\n", "f.conf:2: TOKENS_FILE: must not be empty"},
		{"unknown key", "[pepsi-ingress]\nPORT = 80\n", "f.conf:2: PORT: unknown key in [pepsi-ingress] (want LISTEN, TOKENS_FILE"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := conf.Parse("f.conf", tc.text)
			if err == nil {
				t.Fatalf("Parse accepted %q", tc.text)
			}
			if !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("error %q\nwant it to start with %q", err, tc.want)
			}
		})
	}
}

func TestIsLoopbackKnowsTheLoopbackAddresses(t *testing.T) {
	for listen, want := range map[string]bool{
		"127.0.0.1:8180": true, "127.1.2.3:1": true, "[::1]:8180": true, "localhost:8180": true,
		":8180": false, "0.0.0.0:8180": false, "[::]:8180": false, "10.0.0.1:8180": false,
		"127.0.0.256:80": false, "127.0.0:80": false, "127.0.0.01:80": false, "example.org:80": false,
		"127.0.0.1": false, "[::1:80": false,
	} {
		if got := conf.IsLoopback(listen); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", listen, got, want)
		}
	}
	c, err := conf.Parse("f.conf", "[pepsi-ingress]\nLISTEN = 0.0.0.0:8180\nTOKENS_FILE = t\n")
	if err != nil || c.Ingress.Listen != "0.0.0.0:8180" {
		t.Errorf("an open listener with TOKENS_FILE: %v, %+v", err, c)
	}
}

func TestAStagesOwnMaxPendingWinsOverIngresses(t *testing.T) {
	c, err := conf.Parse("p.conf", `
[pepsi-ingress]
MAX_PENDING = 5000

[stage-slow]
PROGRAM = slow
MAX_PENDING = 100

[stage-plain]
PROGRAM = plain
`)
	if err != nil {
		t.Fatal(err)
	}
	slow, _ := c.Stage("slow")
	plain, _ := c.Stage("plain")
	if slow.MaxPending != 100 || plain.MaxPending != 0 {
		t.Errorf("MAX_PENDING: slow %d, plain %d; want 100 and 0 (none)", slow.MaxPending, plain.MaxPending)
	}
	if got := c.PendingLimitOf("slow"); got != 100 {
		t.Errorf("ingress limit of slow: %d, want its own 100", got)
	}
	if got := c.PendingLimitOf("plain"); got != 5000 {
		t.Errorf("ingress limit of plain: %d, want [pepsi-ingress]'s 5000", got)
	}
	for _, bad := range []string{"0", "-1", "many", "1000000001"} {
		if _, err := conf.Parse("p.conf", "[stage-s]\nPROGRAM = s\nMAX_PENDING = "+bad+"\n"); err == nil {
			t.Errorf("MAX_PENDING = %s accepted", bad)
		}
	}
}

// HISTORY_KEEP takes up to 3650 days written as a duration as well as in days.
func TestHistoryKeepTakesTheSameBoundInDaysAndAsADuration(t *testing.T) {
	for _, v := range []string{"3650d", "87600h", "8761h"} {
		c, err := conf.Parse("f.conf", "[pepsi-dispatch]\nHISTORY_KEEP = "+v+"\n[stage-a]\nPROGRAM = a\n")
		if err != nil {
			t.Errorf("HISTORY_KEEP = %s: %v", v, err)
		} else if v == "8761h" && c.Dispatch.HistoryKeep != 8761*time.Hour {
			t.Errorf("HISTORY_KEEP = 8761h read as %s", c.Dispatch.HistoryKeep)
		}
	}
}
