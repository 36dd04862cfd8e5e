// Package conf parses pepsi.conf(5): INI text with [section] headers, KEY = value
// lines and # or ; comments. It is pure: it takes the file's text and name and
// returns a checked configuration or an error naming the file, line and key. It
// never opens files, reads the environment or applies defaults it does not document.
package conf

import (
	"bufio"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Defaults, as pepsi-dispatch(1) and pepsi.conf(5) document them.
const (
	DefaultMaxRuntime   = 300 * time.Second
	DefaultIdleTimeout  = 5 * time.Second
	DefaultPollInterval = 30 * time.Second
	// PollIntervalMin bounds POLL_INTERVAL from below: the poll looks for
	// work with a transaction of its own, and at a few microseconds those
	// crowd out the answers they should carry (1ns: 556 messages in 3 s
	// against 1,000 in under one at 1ms, the dispatcher a whole core busy).
	// A NOTIFY wakes it at once; the poll is only its safety net.
	PollIntervalMin      = 10 * time.Millisecond
	DefaultStatsInterval = 60 * time.Second
	DefaultStopGrace     = 10 * time.Second
	// DefaultHistoryKeep is HISTORY_KEEP: how long pepsi.history keeps its
	// rows (7 days).
	DefaultHistoryKeep = 7 * 24 * time.Hour
	DefaultParallelism = 4
	DefaultQueueLimit  = 4
	DefaultMaxMessages = 1000
	// DefaultSessions is SESSIONS: the queue transactions in flight at once.
	DefaultSessions = 1
	// SessionsMin and SessionsMax bound SESSIONS: each session is a database
	// connection and, at full load, a server core.
	SessionsMin = 1
	SessionsMax = 16
	// DefaultLineMax is LINE_MAX: the longest standard input line handed to an
	// INPUT = message stage, in bytes (4 MiB).
	DefaultLineMax = 4 << 20
	// LineMaxMin and LineMaxMax bound LINE_MAX: below 1 KiB a message with any
	// state fails; above 1 GiB is more than one jsonb or bytea value can hold.
	LineMaxMin           = 1 << 10
	LineMaxMax           = 1 << 30
	DefaultRetryDelay    = 1 * time.Second
	DefaultRetryDelayMax = 300 * time.Second
	// DefaultIngressListen is where pepsi-ingress listens: loopback only, so
	// that an ingress without TOKENS_FILE is never reachable from elsewhere.
	DefaultIngressListen = "127.0.0.1:8180"
	// DefaultIngressMaxBody bounds one request body of pepsi-ingress (16 MiB).
	DefaultIngressMaxBody = 16 << 20
	// ingressMaxBodyMax and ingressMaxPendingMax keep the values sane (the
	// latter bounds a stage's MAX_PENDING too).
	ingressMaxBodyMax    = 1 << 30
	ingressMaxPendingMax = 1_000_000_000
)

// Bounds of the per-stage retry and rate keys.
const (
	// RetryLimitMax bounds RETRY_LIMIT: 2^RetryLimitMax times any delay is far
	// beyond RETRY_DELAY_MAX, so a larger limit only makes a message wait longer.
	RetryLimitMax = 1000
	// RateMin and RateMax bound RATE, in messages per second (RateMin: one
	// message every 1000 s).
	RateMin = 0.001
	RateMax = 1_000_000
	// DefaultEmitMax is EMIT_MAX: the most messages one pass of a stage may
	// emit (docs/protocol.md, "Emitting messages").
	DefaultEmitMax = 1000
	// EmitMaxMax bounds EMIT_MAX: the dispatcher holds a pass's emits until
	// its transaction, up to EMIT_MAX lines of at most 64 KiB each per worker.
	EmitMaxMax = 100_000
)

// Config is a parsed pepsi.conf.
type Config struct {
	// Database is a libpq URL or key=value string; empty means the PG* environment.
	Database string
	// Dispatch holds [pepsi-dispatch].
	Dispatch Dispatch
	// Stages holds every [stage-NAME] section, sorted by name.
	Stages []Stage
	// Ingress holds [pepsi-ingress].
	Ingress Ingress
	// Httpd holds [pepsi-httpd].
	Httpd Httpd
}

// Httpd is the [pepsi-httpd] section: pepsi-httpd(8), the status page.
type Httpd struct {
	// Actions offers retry and discard on the page (key ACTIONS), to
	// whoever signs in with a token of TokensFile.
	Actions bool
	// TokensFile holds the tokens that may act (key TOKENS_FILE), in
	// pepsi-ingress's format; ACTIONS = on needs it.
	TokensFile string
}

// Ingress is the [pepsi-ingress] section: pepsi-ingress(8), the front door over
// HTTP.
type Ingress struct {
	// Listen is the host:port to listen on (key LISTEN).
	Listen string
	// TokensFile holds the bearer tokens clients must present; empty means no
	// authentication, allowed only when Listen is a loopback address.
	TokensFile string
	// TLSCert and TLSKey are PEM files; both or neither (then plain HTTP).
	TLSCert, TLSKey string
	// MaxBody bounds a request body, in bytes.
	MaxBody int64
	// MaxPending, when positive, refuses requests for a stage with more pending
	// messages than this (503); 0 means no limit.
	MaxPending int64
}

// Check reports what is wrong with the section as a whole: a listener that
// other hosts can reach must authenticate its clients, and TLS needs both a
// certificate and its key. It names the key to blame; pepsi-ingress calls it
// again after command-line overrides.
func (in Ingress) Check() (key string, err error) {
	if in.TokensFile == "" && !IsLoopback(in.Listen) {
		return "LISTEN", fmt.Errorf("%s is not a loopback address, and there is no TOKENS_FILE: pepsi-ingress would accept messages from anyone who can reach it; set TOKENS_FILE or listen on 127.0.0.1", Quote(in.Listen))
	}
	if (in.TLSCert == "") != (in.TLSKey == "") {
		if in.TLSCert == "" {
			return "TLS_KEY", errors.New("set without TLS_CERT; want both or neither")
		}
		return "TLS_CERT", errors.New("set without TLS_KEY; want both or neither")
	}
	return "", nil
}

// IsLoopback reports whether listen, a host:port, names only the loopback
// interface: 127.0.0.0/8, ::1 or localhost. An empty host ("":8180") means every
// interface, so it is not.
func IsLoopback(listen string) bool {
	host, _, ok := SplitHostPort(listen)
	if !ok {
		return false
	}
	if host == "localhost" || host == "::1" {
		return true
	}
	parts := strings.Split(host, ".")
	if len(parts) != 4 || parts[0] != "127" {
		return false
	}
	for _, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || n > 255 || p != strconv.Itoa(n) {
			return false
		}
	}
	return true
}

// SplitHostPort splits "host:port" or "[v6]:port" (net.SplitHostPort, which the
// core may not import); the port must be a number from 0 to 65535.
func SplitHostPort(s string) (host, port string, ok bool) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return "", "", false
	}
	host, port = s[:i], s[i+1:]
	if strings.HasPrefix(host, "[") {
		if !strings.HasSuffix(host, "]") {
			return "", "", false
		}
		host = host[1 : len(host)-1]
	} else if strings.ContainsAny(host, ":[]") {
		return "", "", false
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 || port != strconv.Itoa(n) {
		return "", "", false
	}
	return host, port, true
}

// Dispatch is the [pepsi-dispatch] section.
type Dispatch struct {
	MaxRuntime    time.Duration
	IdleTimeout   time.Duration
	PollInterval  time.Duration
	StatsInterval time.Duration
	// StopGrace is how long a stopped worker may take to exit before it is killed
	// (key STOP_GRACE, a PEPSI extension; default 10 s).
	StopGrace time.Duration
	// ConfigFile is passed to workers as "-c FILE"; default: the file parsed.
	// ConfigFileSet says the file set it (CONFIG_FILE), to be handed on as
	// written rather than as the dispatcher found the file.
	ConfigFile    string
	ConfigFileSet bool
	// Vacuum lets the dispatcher vacuum pepsi.queue itself when dead rows pile
	// up (key VACUUM, on or off, a PEPSI extension; default on). Off leaves
	// vacuuming to autovacuum or a DBA.
	Vacuum bool
	// LineMax is the longest line, in bytes, handed to an INPUT = message
	// stage; a message whose line would be longer fails with a reason that
	// says so (key LINE_MAX, a PEPSI extension; default DefaultLineMax).
	LineMax int
	// HistoryKeep is how long pepsi.history keeps its rows (key HISTORY_KEEP;
	// default DefaultHistoryKeep): the dispatcher drops the table's daily
	// partitions wholly older than this. Zero means the default.
	HistoryKeep time.Duration
	// Sessions is how many queue transactions the dispatcher may have in
	// flight at once, each on a database session of its own (key SESSIONS,
	// a PEPSI extension; default DefaultSessions, from SessionsMin to
	// SessionsMax). Beside the step's transaction, which claims, wakes and
	// releases, the others only resolve answered passes (docs/scaling.md).
	Sessions int
}

// Input is what a stage reads on standard input (key INPUT, a PEPSI extension).
type Input string

// The inputs.
const (
	// InputID: one decimal message id per line; the stage reads the row itself.
	InputID Input = "id"
	// InputMessage: one JSON object per line, the message itself (id, stage,
	// attempts, state, payload); the stage needs no database.
	InputMessage Input = "message"
)

// Stage is one [stage-NAME] section.
type Stage struct {
	Name        string
	Program     string
	Parallelism int
	QueueLimit  int
	MaxMessages int
	// RetryLimit is how many times a message may be retried at this stage
	// (answer "75 REASON") before that answer fails it; 0, the default, makes
	// 75 an ordinary failure (key RETRY_LIMIT, a PEPSI extension).
	RetryLimit int
	// RetryDelay is the delay before the first retry; each further retry
	// doubles it (key RETRY_DELAY, default 1 s).
	RetryDelay time.Duration
	// RetryDelayMax caps the doubled delay (key RETRY_DELAY_MAX, default
	// 300 s; never below RetryDelay).
	RetryDelayMax time.Duration
	// Rate is the most messages per second claimed for this stage, a positive
	// decimal; 0 means no limit (key RATE, default none).
	Rate float64
	// Input is what the stage reads on standard input (key INPUT; default
	// InputID).
	Input Input
	// MaxRuntime is this stage's own watchdog: how long a message may stay
	// unanswered at the head of one of its workers (key MAX_RUNTIME, a PEPSI
	// extension). 0, the default, means the dispatcher's MAX_RUNTIME, which a
	// command-line flag may still override; RuntimeOf resolves it.
	MaxRuntime time.Duration
	// MaxPending is the stage's back-pressure limit (key MAX_PENDING, a PEPSI
	// extension; 0, the default, means none): while more than this many of
	// its messages are pending, the dispatcher claims nothing for the stages
	// that feed it, and pepsi-ingress refuses requests into it (503). It
	// wins over [pepsi-ingress] MAX_PENDING for this stage.
	MaxPending int64
	// HistoryOff leaves this stage's passes out of pepsi.history (key HISTORY,
	// on or off; default on).
	HistoryOff bool
	// EmitMax is the most messages one pass of this stage may emit (emit
	// lines before its answer); a pass that emits more fails its message
	// (key EMIT_MAX, a PEPSI extension; default DefaultEmitMax).
	EmitMax int
}

// PendingLimitOf is the most messages pending at stage name past which
// pepsi-ingress refuses requests into it: the stage's own MAX_PENDING, or
// else [pepsi-ingress] MAX_PENDING; 0 for no limit.
func (c *Config) PendingLimitOf(name string) int64 {
	if s, ok := c.Stage(name); ok && s.MaxPending > 0 {
		return s.MaxPending
	}
	return c.Ingress.MaxPending
}

// RuntimeOf is the watchdog of stage s under the dispatcher section d: the
// stage's own MAX_RUNTIME, or else the dispatcher's.
func (d Dispatch) RuntimeOf(s Stage) time.Duration {
	if s.MaxRuntime > 0 {
		return s.MaxRuntime
	}
	return d.MaxRuntime
}

// Stage returns the stage called name, or false.
func (c *Config) Stage(name string) (Stage, bool) {
	i := sort.Search(len(c.Stages), func(i int) bool { return c.Stages[i].Name >= name })
	if i < len(c.Stages) && c.Stages[i].Name == name {
		return c.Stages[i], true
	}
	return Stage{}, false
}

// Error is a configuration error at a place in a file.
type Error struct {
	File string
	Line int
	Key  string
	Msg  string
}

func (e *Error) Error() string {
	place := e.File
	if e.Line > 0 {
		place = fmt.Sprintf("%s:%d", e.File, e.Line)
	}
	if e.Key != "" {
		return fmt.Sprintf("%s: %s: %s", place, keyText(e.Key), e.Msg)
	}
	return fmt.Sprintf("%s: %s", place, e.Msg)
}

// keyText writes a key for an error: as it is when it is printable ASCII
// without blanks (as every known key is), else quoted (Quote), so that a
// key holding what cannot be seen (a zero-width space, a control
// character) does not read as the known key it resembles.
func keyText(key string) string {
	for _, r := range key {
		if r <= ' ' || r > '~' {
			return Quote(key)
		}
	}
	return key
}

// Parse parses the text of a pepsi.conf called file. A UTF-8 byte order
// mark at its start, which some editors write, is not part of the text.
func Parse(file, text string) (*Config, error) {
	text = strings.TrimPrefix(text, "\uFEFF")
	p := &parser{file: file, stages: map[string]*Stage{}, stageLine: map[string]int{}, sectionLine: map[string]int{},
		seen: map[string]int{}, ingressLine: map[string]int{},
		c: &Config{Dispatch: Dispatch{
			MaxRuntime:    DefaultMaxRuntime,
			IdleTimeout:   DefaultIdleTimeout,
			PollInterval:  DefaultPollInterval,
			StatsInterval: DefaultStatsInterval,
			StopGrace:     DefaultStopGrace,
			Vacuum:        true,
			LineMax:       DefaultLineMax,
			HistoryKeep:   DefaultHistoryKeep,
			Sessions:      DefaultSessions,
			ConfigFile:    file,
		}, Ingress: Ingress{Listen: DefaultIngressListen, MaxBody: DefaultIngressMaxBody}}}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for p.n = 1; sc.Scan(); p.n++ {
		line := strings.TrimSpace(sc.Text())
		var err error
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[':
			err = p.header(line)
		default:
			err = p.setting(line)
		}
		if err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		msg := err.Error()
		if errors.Is(err, bufio.ErrTooLong) {
			msg = "line is longer than 1048576 bytes"
		}
		return nil, &Error{File: file, Line: p.n, Msg: msg}
	}
	return p.finish()
}

// parser is the state of Parse while it reads a file, line by line.
type parser struct {
	file      string
	c         *Config
	stages    map[string]*Stage
	stageLine map[string]int // where each [stage-NAME] starts
	// sectionLine is where each of the other sections starts.
	sectionLine map[string]int
	stageOrder  []string // names in the order of their sections, for errors
	// seen is where each SECTION.KEY was set.
	seen map[string]int
	// ingressLine is where LISTEN, TLS_CERT and TLS_KEY (and, as
	// httpd.ACTIONS, [pepsi-httpd]'s ACTIONS) were set, for Check's
	// errors.
	ingressLine map[string]int
	section     string // the section being read
	n           int    // the line being read
}

// bad is an error at the line being read.
func (p *parser) bad(key, format string, args ...any) error {
	return &Error{File: p.file, Line: p.n, Key: key, Msg: fmt.Sprintf(format, args...)}
}

// header reads a section header, "[NAME]".
func (p *parser) header(line string) error {
	if !strings.HasSuffix(line, "]") {
		return p.bad("", "section header %s has no closing ]", Quote(line))
	}
	p.section = strings.TrimSpace(line[1 : len(line)-1])
	switch {
	case p.section == "pepsi", p.section == "pepsi-dispatch", p.section == "pepsi-ingress", p.section == "pepsi-httpd":
		if first, dup := p.sectionLine[p.section]; dup {
			return p.bad("", "section [%s] appears twice (first at line %d)", p.section, first)
		}
		p.sectionLine[p.section] = p.n
		return nil
	case strings.HasPrefix(p.section, "stage-"):
		return p.newStage(strings.TrimPrefix(p.section, "stage-"))
	}
	return p.bad("", "unknown section [%s] (want [pepsi], [pepsi-dispatch], [pepsi-ingress], [pepsi-httpd] or [stage-NAME])", p.section)
}

// newStage starts the stage of a [stage-NAME] section, with the defaults.
func (p *parser) newStage(name string) error {
	switch name {
	case ReservedDone:
		return p.bad("", "stage name %s is reserved: a stage that answers '0 >done' finishes its message", Quote(name))
	case ReservedPaused:
		return p.bad("", "stage name %s is reserved: a stage that answers '0 >paused:SECONDS' pauses its message", Quote(name))
	}
	if !ValidStageName(name) {
		return p.bad("", "stage name %s: use letters, digits, '_' and '-'", Quote(name))
	}
	if _, dup := p.stages[name]; dup {
		return p.bad("", "section [%s] appears twice (first at line %d)", p.section, p.stageLine[name])
	}
	p.stages[name] = &Stage{Name: name, Parallelism: DefaultParallelism,
		QueueLimit: DefaultQueueLimit, MaxMessages: DefaultMaxMessages,
		RetryDelay: DefaultRetryDelay, RetryDelayMax: DefaultRetryDelayMax, Input: InputID, EmitMax: DefaultEmitMax}
	p.stageLine[name] = p.n
	p.stageOrder = append(p.stageOrder, name)
	return nil
}

// setting reads a "KEY = value" line of the current section.
func (p *parser) setting(line string) error {
	key, value, ok := strings.Cut(line, "=")
	if !ok {
		return p.bad("", "want KEY = value, got %s", Quote(line))
	}
	key, value = strings.TrimSpace(key), strings.TrimSpace(value)
	if p.section == "" {
		return p.bad(key, "key outside any section")
	}
	if strings.ContainsRune(value, 0) {
		// No value can hold one: a program path, a connection string or a
		// name would be cut there by whatever reads it.
		return p.bad(key, "the value holds a NUL byte")
	}
	where := p.section + "." + key
	if first, dup := p.seen[where]; dup {
		return p.bad(key, "set twice in [%s] (first at line %d)", p.section, first)
	}
	p.seen[where] = p.n
	var known bool
	var err error
	want := "PROGRAM, PARALLELISM, QUEUE_LIMIT, MAX_MESSAGES, RETRY_LIMIT, RETRY_DELAY, RETRY_DELAY_MAX, RATE, INPUT, MAX_RUNTIME, MAX_PENDING, HISTORY or EMIT_MAX"
	switch p.section {
	case "pepsi":
		known, want = key == "DATABASE", "DATABASE"
		if known {
			p.c.Database = value
		}
	case "pepsi-dispatch":
		known, err = setDispatch(&p.c.Dispatch, key, value)
		want = "MAX_RUNTIME, WORKER_IDLE_TIMEOUT, POLL_INTERVAL, STATS_INTERVAL, STOP_GRACE, CONFIG_FILE, VACUUM, LINE_MAX, HISTORY_KEEP or SESSIONS"
	case "pepsi-ingress":
		known, err = setIngress(&p.c.Ingress, key, value)
		want = "LISTEN, TOKENS_FILE, TLS_CERT, TLS_KEY, MAX_BODY or MAX_PENDING"
		if key == "LISTEN" || key == "TLS_CERT" || key == "TLS_KEY" {
			p.ingressLine[key] = p.n
		}
	case "pepsi-httpd":
		known, err = setHttpd(&p.c.Httpd, key, value)
		want = "ACTIONS or TOKENS_FILE"
		if key == "ACTIONS" {
			p.ingressLine["httpd."+key] = p.n
		}
	default:
		known, err = setStage(p.stages[strings.TrimPrefix(p.section, "stage-")], key, value)
	}
	switch {
	case !known:
		return p.bad(key, "unknown key in [%s] (want %s)", p.section, want)
	case err != nil:
		return p.bad(key, "%v", err)
	}
	return nil
}

// setDispatch sets one key of [pepsi-dispatch]; known is false for a key it
// does not have.
func setDispatch(d *Dispatch, key, value string) (known bool, err error) {
	switch key {
	case "MAX_RUNTIME":
		d.MaxRuntime, err = ParseDuration(value)
	case "WORKER_IDLE_TIMEOUT":
		d.IdleTimeout, err = ParseDuration(value)
	case "POLL_INTERVAL":
		d.PollInterval, err = ParsePollInterval(value)
	case "STATS_INTERVAL":
		d.StatsInterval, err = ParseDuration(value)
	case "STOP_GRACE":
		d.StopGrace, err = ParseDuration(value)
	case "CONFIG_FILE":
		d.ConfigFile, err = nonEmpty(value)
		d.ConfigFileSet = true
	case "VACUUM":
		d.Vacuum, err = ParseOnOff(value)
	case "LINE_MAX":
		d.LineMax, err = parseLineMax(value)
	case "HISTORY_KEEP":
		d.HistoryKeep, err = parseKeep(value)
	case "SESSIONS":
		d.Sessions, err = ParseSessions(value)
	default:
		return false, nil
	}
	return true, err
}

// setIngress sets one key of [pepsi-ingress]; known is false for a key it
// does not have.
func setIngress(in *Ingress, key, value string) (known bool, err error) {
	switch key {
	case "LISTEN":
		if _, _, ok := SplitHostPort(value); !ok {
			err = fmt.Errorf("%s is not host:port (127.0.0.1:8180, [::1]:8180, :8180)", Quote(value))
		}
		in.Listen = value
	case "TOKENS_FILE":
		in.TokensFile, err = nonEmpty(value)
	case "TLS_CERT":
		in.TLSCert, err = nonEmpty(value)
	case "TLS_KEY":
		in.TLSKey, err = nonEmpty(value)
	case "MAX_BODY":
		in.MaxBody, err = parseBounded(value, ingressMaxBodyMax)
	case "MAX_PENDING":
		in.MaxPending, err = parseBounded(value, ingressMaxPendingMax)
	default:
		return false, nil
	}
	return true, err
}

// setHttpd sets one key of [pepsi-httpd]; known is false for a key it does
// not have.
func setHttpd(h *Httpd, key, value string) (known bool, err error) {
	switch key {
	case "ACTIONS":
		h.Actions, err = ParseOnOff(value)
	case "TOKENS_FILE":
		h.TokensFile, err = nonEmpty(value)
	default:
		return false, nil
	}
	return true, err
}

// setStage sets one key of a [stage-NAME]; known is false for a key it does
// not have.
func setStage(s *Stage, key, value string) (known bool, err error) {
	switch key {
	case "PROGRAM":
		s.Program, err = parseProgram(value)
	case "PARALLELISM":
		s.Parallelism, err = parsePositive(value)
	case "QUEUE_LIMIT":
		s.QueueLimit, err = parsePositive(value)
	case "MAX_MESSAGES":
		s.MaxMessages, err = parsePositive(value)
	case "RETRY_LIMIT":
		s.RetryLimit, err = parseRetryLimit(value)
	case "RETRY_DELAY":
		s.RetryDelay, err = ParseDuration(value)
	case "RETRY_DELAY_MAX":
		s.RetryDelayMax, err = ParseDuration(value)
	case "INPUT":
		s.Input, err = parseInput(value)
	case "RATE":
		s.Rate, err = ParseRate(value)
	case "MAX_RUNTIME":
		s.MaxRuntime, err = ParseDuration(value)
	case "MAX_PENDING":
		s.MaxPending, err = parseBounded(value, ingressMaxPendingMax)
	case "HISTORY":
		var on bool
		on, err = ParseOnOff(value)
		s.HistoryOff = !on
	case "EMIT_MAX":
		s.EmitMax, err = parseEmitMax(value)
	default:
		return false, nil
	}
	return true, err
}

// finish checks what only the whole file can tell (every stage has a
// PROGRAM, its retry delays are in order, the ingress settings agree) and
// returns the configuration, its stages sorted by name.
func (p *parser) finish() (*Config, error) {
	c := p.c
	for _, name := range p.stageOrder {
		s := p.stages[name]
		if s.Program == "" {
			return nil, &Error{File: p.file, Line: p.stageLine[name], Key: "PROGRAM", Msg: fmt.Sprintf("[stage-%s] has no PROGRAM", name)}
		}
		if s.RetryDelayMax < s.RetryDelay {
			// Named at the line of whichever of the two the file sets last.
			key, line := "RETRY_DELAY_MAX", p.seen["stage-"+name+".RETRY_DELAY_MAX"]
			if l := p.seen["stage-"+name+".RETRY_DELAY"]; l > line {
				key, line = "RETRY_DELAY", l
			}
			return nil, &Error{File: p.file, Line: line, Key: key,
				Msg: fmt.Sprintf("RETRY_DELAY_MAX %s is below RETRY_DELAY %s", s.RetryDelayMax, s.RetryDelay)}
		}
		c.Stages = append(c.Stages, *s)
	}
	sort.Slice(c.Stages, func(i, j int) bool { return c.Stages[i].Name < c.Stages[j].Name })
	if key, err := c.Ingress.Check(); err != nil {
		return nil, &Error{File: p.file, Line: p.ingressLine[key], Key: key, Msg: err.Error()}
	}
	if c.Httpd.Actions && c.Httpd.TokensFile == "" {
		// Actions without tokens would let anyone who reaches the page act.
		return nil, &Error{File: p.file, Line: p.ingressLine["httpd.ACTIONS"], Key: "ACTIONS",
			Msg: "on without TOKENS_FILE: the page's actions need the tokens that may use them; set TOKENS_FILE in [pepsi-httpd]"}
	}
	return c, nil
}

// Quote writes a value the operator gave (or a line of the file) for an
// error or a log message: in single quotes, with Go's escapes for what is not
// printable, so that it stays on one line. Not in double quotes: the
// programs' text logs quote a message or error that has spaces, and would
// escape each double quote inside it again (err="\"5 min\" is not ...").
func Quote(s string) string {
	q := strconv.Quote(s)
	q = strings.ReplaceAll(q[1:len(q)-1], `\"`, `"`)
	return "'" + strings.ReplaceAll(q, "'", `\'`) + "'"
}

// ParseDuration reads whole seconds ("30") or Go duration text ("250ms", "1m30s").
// The result must be positive and at most a year, so that no sum or doubling
// of durations the dispatcher makes runs past an int64 of nanoseconds.
func ParseDuration(s string) (time.Duration, error) {
	return parseDurationMax(s, 365*24*time.Hour, "a year")
}

// ParsePollInterval reads a POLL_INTERVAL: a ParseDuration of at least
// PollIntervalMin.
func ParsePollInterval(s string) (time.Duration, error) {
	d, err := ParseDuration(s)
	if err == nil && d < PollIntervalMin {
		return 0, fmt.Errorf("%s is too short (at least %v: a NOTIFY wakes the dispatcher at once, the poll is only its safety net)", Quote(s), PollIntervalMin)
	}
	return d, err
}

// parseDurationMax is ParseDuration with most as its bound, named maxText in
// its error. A value too large for a time.Duration at all is said to be too
// long, not to be no duration.
func parseDurationMax(s string, most time.Duration, maxText string) (time.Duration, error) {
	tooLong := fmt.Errorf("%s is too long (at most %s)", Quote(s), maxText)
	notPositive := fmt.Errorf("%s must be positive", Quote(s))
	var d time.Duration
	if n, err := strconv.ParseInt(s, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		switch {
		case err != nil && s[0] == '-':
			return 0, notPositive
		case err != nil || n > int64(most/time.Second):
			return 0, tooLong
		}
		d = time.Duration(n) * time.Second
	} else if d, err = time.ParseDuration(s); err != nil {
		switch {
		case !durationText(s):
			return 0, fmt.Errorf("%s is not whole seconds nor a duration like 250ms or 1m30s", Quote(s))
		case s[0] == '-':
			return 0, notPositive
		}
		return 0, tooLong // well formed: only too large for time.ParseDuration
	} else if d > most {
		return 0, tooLong
	}
	if d <= 0 {
		return 0, notPositive
	}
	return d, nil
}

// durationText says whether s has the form time.ParseDuration reads (an
// optional sign, then numbers each with a unit), whatever its size.
func durationText(s string) bool {
	if s != "" && (s[0] == '+' || s[0] == '-') {
		s = s[1:] // one sign, as time.ParseDuration takes
	}
	if s == "" {
		return false
	}
	for s != "" {
		digits := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
		if digits <= 0 || strings.Count(s[:digits], ".") > 1 || s[:digits] == "." {
			return false
		}
		s = s[digits:]
		unit := len(s)
		if i := strings.IndexAny(s, "0123456789."); i >= 0 {
			unit = i
		}
		switch s[:unit] {
		case "ns", "us", "\u00b5s", "\u03bcs", "ms", "s", "m", "h":
		default:
			return false
		}
		s = s[unit:]
	}
	return true
}

// historyKeepMax bounds HISTORY_KEEP, in days and as a duration alike.
const historyKeepMax = 3650 * 24 * time.Hour

// parseKeep reads HISTORY_KEEP: whole days ("7d") or a duration as
// ParseDuration reads it, up to historyKeepMax either way.
func parseKeep(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n <= 0 || n > 3650 {
			return 0, fmt.Errorf("%s is not a whole number of days from 1 to 3650", Quote(s))
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return parseDurationMax(s, historyKeepMax, "3650 days")
}

// parsePositive reads a count (PARALLELISM, QUEUE_LIMIT, MAX_MESSAGES): a
// whole number from 1 to 1,000,000.
func parsePositive(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if tooLarge(s, err) {
		return 0, fmt.Errorf("%s is larger than 1000000", Quote(s))
	}
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s is not a positive whole number", Quote(s))
	}
	if n > 1_000_000 {
		return 0, fmt.Errorf("%s is larger than 1000000", Quote(s))
	}
	return n, nil
}

// parseEmitMax reads EMIT_MAX: a whole number from 0 (the stage emits
// nothing) to EmitMaxMax.
func parseEmitMax(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > EmitMaxMax {
		return 0, fmt.Errorf("%s is not a whole number from 0 to %d", Quote(s), EmitMaxMax)
	}
	return n, nil
}

func parseRetryLimit(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > RetryLimitMax {
		return 0, fmt.Errorf("%s is not a whole number from 0 to %d", Quote(s), RetryLimitMax)
	}
	return n, nil
}

// parseProgram reads a stage's PROGRAM: a bare name, looked up on PATH, or an
// absolute path. A relative path with a slash ("sub/prog", "./stage.py") is
// refused: it would name a program relative to the dispatcher's working
// directory, so the stage would start or not depending on where the
// dispatcher happens to run (and exec.LookPath refuses such names for the same
// reason). The protocol says PATH unless absolute; nothing in between.
func parseProgram(s string) (string, error) {
	if s == "" {
		return "", errors.New("must not be empty")
	}
	if strings.Contains(s, "/") && !strings.HasPrefix(s, "/") {
		return "", fmt.Errorf("%s is a relative path: a path must be absolute (a bare name is looked up on PATH)", Quote(s))
	}
	return s, nil
}

// tooLarge says whether err, strconv's answer for s, is a whole number
// too large for an int64: a positive one, which is then larger than any
// bound of this file, not something other than a whole number.
func tooLarge(s string, err error) bool {
	return errors.Is(err, strconv.ErrRange) && s[0] != '-'
}

func nonEmpty(s string) (string, error) {
	if s == "" {
		return "", errors.New("must not be empty")
	}
	return s, nil
}

// parseBounded reads a whole number from 1 to max.
func parseBounded(s string, max int64) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if tooLarge(s, err) {
		return 0, fmt.Errorf("%s is larger than %d", Quote(s), max)
	}
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s is not a positive whole number", Quote(s))
	}
	if n > max {
		return 0, fmt.Errorf("%s is larger than %d", Quote(s), max)
	}
	return n, nil
}

// ParseRate reads a RATE: a positive decimal number of messages per second
// ("50", "0.5", "2.25"), from RateMin to RateMax. Exponents, hexadecimal, infinities and
// signs are refused: a rate is written the way an operator reads it.
func ParseRate(s string) (float64, error) {
	bad := fmt.Errorf("%s is not a positive decimal number of messages per second (like 50 or 0.5)", Quote(s))
	if s == "" || strings.Trim(s, "0123456789.") != "" || strings.Count(s, ".") > 1 {
		return 0, bad
	}
	r, err := strconv.ParseFloat(s, 64)
	if err != nil || r <= 0 {
		return 0, bad
	}
	if r > RateMax {
		return 0, fmt.Errorf("%s is more than %d messages per second", Quote(s), RateMax)
	}
	if r < RateMin {
		return 0, fmt.Errorf("%s is less than %g messages per second", Quote(s), RateMin)
	}
	return r, nil
}

// parseInput reads an INPUT: id or message.
func parseInput(s string) (Input, error) {
	switch in := Input(s); in {
	case InputID, InputMessage:
		return in, nil
	}
	return "", fmt.Errorf("%s is neither id nor message", Quote(s))
}

// ParseSessions reads a SESSIONS: a whole number from SessionsMin to
// SessionsMax.
func ParseSessions(s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < SessionsMin || n > SessionsMax {
		return 0, fmt.Errorf("%s is not a whole number of sessions from %d to %d", Quote(s), SessionsMin, SessionsMax)
	}
	return n, nil
}

// parseLineMax reads a LINE_MAX: a whole number of bytes from LineMaxMin to
// LineMaxMax.
func parseLineMax(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < LineMaxMin || n > LineMaxMax {
		return 0, fmt.Errorf("%s is not a whole number of bytes from %d to %d", Quote(s), LineMaxMin, LineMaxMax)
	}
	return n, nil
}

// ParseOnOff reads a switch: on/off, true/false, yes/no or 1/0.
func ParseOnOff(s string) (bool, error) {
	switch strings.ToLower(s) {
	case "on", "true", "yes", "1":
		return true, nil
	case "off", "false", "no", "0":
		return false, nil
	}
	return false, fmt.Errorf("%s is not on or off", Quote(s))
}

// The words that are not stage names, because a status line's target spells
// them: "0 >done" finishes a message and "0 >paused:SECONDS" pauses it (so a
// bare "0 >paused" is an invalid target, never a stage).
const (
	ReservedDone   = "done"
	ReservedPaused = "paused"
)

// ValidStageName reports whether s may name a stage: 1 to 63 letters, digits,
// '_' and '-', so it is safe in logs, status lines and section headers, and
// neither ReservedDone nor ReservedPaused.
func ValidStageName(s string) bool {
	if s == "" || len(s) > 63 || s == ReservedDone || s == ReservedPaused {
		return false
	}
	for _, r := range s {
		if !(r == '_' || r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}
