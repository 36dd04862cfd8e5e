// Package cliflags parses the command line of a PEPSI program the same way in
// each: the flags, then (with an environment prefix) a PREFIX_NAME variable for
// each flag the command line did not give, as ff/v3 reads them. A mistake is one
// line and a pointer to -h, not the whole help: the help buries the one line
// that says what is wrong. And it remembers where each value came from, so that a
// bad value is blamed on what the operator actually set: the flag, or the
// environment variable.
package cliflags

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/peterbourgon/ff/v3"

	"github.com/pepsi-pipeline/pepsi/internal/buildinfo"
)

// ExitUsage is the exit status of a bad command line, in every PEPSI program.
const ExitUsage = 2

// Parsed is a parsed command line.
type Parsed struct {
	envPrefix string
	onLine    map[string]bool // flags the command line gave
}

// ErrVersion is what Parse returns after printing the version for -version. It
// is a flag.ErrHelp, so a caller that stops quietly after help stops after it.
var ErrVersion = fmt.Errorf("version printed: %w", flag.ErrHelp)

// Main runs a program: run, with the command line's arguments and the
// standard output and error, under a context that ends at the first SIGINT
// or SIGTERM; then it exits with run's status.
func Main(run func(ctx context.Context, args []string, stdout, stderr io.Writer) int) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// NewFlagSet returns the flag set of the program called name, whose help
// prints usage and then the flags. Only -h and -version write to stdout (see
// Parse); a mistake is Parse's error, for Fail.
func NewFlagSet(name, usage string, stdout io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	return fs
}

// Parse parses args into fs, then, when envPrefix is not empty, the environment:
// -max-runtime from PREFIX_MAX_RUNTIME unless the command line gave it. Asked for
// help (-h, -help), it prints fs.Usage to fs.Output() and returns flag.ErrHelp;
// asked for -version (a flag every PEPSI program has; Parse adds it), it prints
// buildinfo.Version to fs.Output() and returns ErrVersion; for any other mistake
// it prints nothing and returns the error, one line for Fail.
func Parse(fs *flag.FlagSet, args []string, envPrefix string) (*Parsed, error) {
	if fs.Lookup("version") == nil {
		fs.Var(versionFlag{}, "version", "print the program's version and exit")
	}
	// The flag package prints its error and then the whole usage: keep both for
	// -h alone.
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	var opts []ff.Option
	if envPrefix != "" {
		opts = append(opts, ff.WithEnvVarPrefix(envPrefix))
	}
	err := ff.Parse(fs, args, opts...)
	fs.Usage = usage
	fs.SetOutput(out)
	if errors.Is(err, flag.ErrHelp) {
		if fs.Usage != nil {
			fs.Usage()
		} else {
			fmt.Fprintf(out, "Usage of %s:\n", fs.Name())
			fs.PrintDefaults()
		}
		return nil, flag.ErrHelp
	}
	if err != nil {
		// ff prefixes "error parsing commandline arguments: ", which says nothing more.
		if inner := errors.Unwrap(err); inner != nil {
			err = inner
		}
		return nil, err
	}
	onLine := givenOnLine(fs, args)
	if _, ok := fs.Lookup("version").Value.(versionFlag); ok && onLine["version"] {
		fmt.Fprintln(out, buildinfo.Version(strings.Fields(fs.Name())[0]))
		return nil, ErrVersion
	}
	return &Parsed{envPrefix: envPrefix, onLine: onLine}, nil
}

// versionFlag is -version: only the command line asks for the version. It
// takes any value and keeps none, so that a PREFIX_VERSION variable in the
// environment (a deployment's own, say) neither stops the program nor fails
// its start.
type versionFlag struct{}

func (versionFlag) String() string   { return "" }
func (versionFlag) Set(string) error { return nil }
func (versionFlag) IsBoolFlag() bool { return true }

// Fail reports err, a mistake on the command line of prog, as one line and a
// pointer to the help, and returns the exit status: 0 for flag.ErrHelp (the
// help is printed already), else ExitUsage.
func Fail(w io.Writer, prog string, err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintf(w, "%s: %v\nRun '%s -h' for help.\n", prog, err, prog)
	return ExitUsage
}

// Name is how the operator set the flag called name: "-max-runtime", or
// "PEPSI_MAX_RUNTIME" when its value came from the environment. Name a bad value
// by it, so that the operator looks where the value was set.
func (p *Parsed) Name(name string) string {
	if p != nil && p.envPrefix != "" && !p.onLine[name] {
		if key := EnvVar(p.envPrefix, name); os.Getenv(key) != "" {
			return key
		}
	}
	return "-" + name
}

// OutOfRange names the first flag of fs among names whose number is below
// least (an int or a time.Duration flag; least 0 or 1, in its units), with
// its value, as the operator set it ("-committers 0: must be at least 1"),
// or "" when none is. A check of several flags at once must still say which
// one was wrong.
func (p *Parsed) OutOfRange(fs *flag.FlagSet, least int64, names ...string) string {
	for _, name := range names {
		f := fs.Lookup(name)
		if f == nil {
			panic(fmt.Sprintf("cliflags: OutOfRange of -%s, which is no flag", name)) // a check that could never fail
		}
		var n int64
		switch v := f.Value.(flag.Getter).Get().(type) {
		case int:
			n = int64(v)
		case int64:
			n = v
		case time.Duration:
			n = int64(v)
		default:
			panic(fmt.Sprintf("cliflags: OutOfRange of -%s, a %T", name, v))
		}
		if n >= least {
			continue
		}
		want := "must be positive"
		if least == 0 {
			want = "must not be negative"
		}
		return fmt.Sprintf("%s %s: %s", p.Name(name), f.Value.String(), want)
	}
	return ""
}

// EnvVar is the environment variable that sets the flag called name, as ff/v3
// names it: PEPSI and max-runtime give PEPSI_MAX_RUNTIME.
func EnvVar(prefix, name string) string {
	return prefix + "_" + strings.ToUpper(strings.NewReplacer("-", "_", ".", "_", "/", "_").Replace(name))
}

// givenOnLine returns the flags args sets. It parses args again into a copy of
// fs whose values ignore what they are set to: fs itself, after ff, cannot tell a
// value of the command line from one of the environment.
func givenOnLine(fs *flag.FlagSet, args []string) map[string]bool {
	scratch := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	scratch.SetOutput(io.Discard)
	fs.VisitAll(func(f *flag.Flag) {
		b, ok := f.Value.(interface{ IsBoolFlag() bool })
		scratch.Var(ignored{isBool: ok && b.IsBoolFlag()}, f.Name, "")
	})
	// args parsed into fs already: they parse here too.
	_ = scratch.Parse(args)
	given := map[string]bool{}
	scratch.Visit(func(f *flag.Flag) { given[f.Name] = true })
	return given
}

// ignored is a flag value that accepts anything and keeps nothing.
type ignored struct{ isBool bool }

func (ignored) String() string     { return "" }
func (ignored) Set(string) error   { return nil }
func (v ignored) IsBoolFlag() bool { return v.isBool }

// Database picks a program's database: the -database flag or its
// PREFIX_DATABASE variable (flagValue), else the [pepsi] DATABASE of the
// configuration file called file (fileValue), else libpq's PG* environment
// (""). from says where it came from, for the program's start-up log line
// (with Redact(db)). When a variable in the environment, not the command
// line, overrides a DATABASE the file sets to something else, it warns at
// once: an exported PEPSI_DATABASE (as for the demo) would otherwise point the
// program at another database without a word.
func (p *Parsed) Database(log *slog.Logger, flagValue, file, fileValue string) (db, from string) {
	switch {
	case flagValue != "":
		from = p.Name("database")
		if from != "-database" && fileValue != "" && fileValue != flagValue {
			log.Warn("the environment overrides the configuration file's database", "from", from,
				"overrides", file+" [pepsi] DATABASE", "database", Redact(flagValue))
		}
		return flagValue, from
	case fileValue != "":
		return fileValue, file + " [pepsi] DATABASE"
	}
	return "", "the libpq environment (PGHOST, PGDATABASE, ...): no -database, " + EnvVar(p.prefix(), "database") + " nor [pepsi] DATABASE"
}

// prefix is the environment prefix, PEPSI when there is none.
func (p *Parsed) prefix() string {
	if p == nil || p.envPrefix == "" {
		return "PEPSI"
	}
	return p.envPrefix
}

// Redact is a connection string fit for a log: a URL's password, and a
// key=value string's password, replaced by xxx. A string it cannot read as
// libpq would (an unterminated quote, a URL with a fragment, where a
// password's '#' would put the rest of it) is not shown at all: a log line
// must never carry a password, even of a string that cannot connect.
func Redact(db string) string {
	const unreadable = "(a connection string that cannot be read; not shown, as it may hold a password)"
	if strings.HasPrefix(db, "postgres://") || strings.HasPrefix(db, "postgresql://") {
		u, err := url.Parse(db)
		// An '@' past the host means url.Parse took a password's '?' or '/'
		// for the end of the user information, where a libpq or pgx reading
		// may not: what it shows may hold a password, so it is not shown.
		if err != nil || u.Fragment != "" || strings.Contains(db, "#") || strings.Contains(u.Path+u.RawQuery, "@") || u.Opaque != "" {
			return unreadable
		}
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "xxx")
		}
		q := u.Query()
		if q.Has("password") {
			q.Set("password", "xxx")
			u.RawQuery = q.Encode()
		}
		return u.String()
	}
	pairs, ok := conninfoPairs(db)
	if !ok {
		return unreadable
	}
	out := make([]string, len(pairs))
	for i, p := range pairs {
		if p[0] == "password" {
			p[1] = "xxx"
		}
		out[i] = p[0] + "=" + p[1]
	}
	return strings.Join(out, " ")
}

// conninfoPairs splits a libpq key=value string into its pairs, each value as
// written (quotes and escapes kept), the way libpq reads it: blanks may stand
// around '=', and a value in single quotes may hold blanks and \' escapes.
func conninfoPairs(s string) ([][2]string, bool) {
	var pairs [][2]string
	blank := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' }
	i := 0
	for {
		for i < len(s) && blank(s[i]) {
			i++
		}
		if i == len(s) {
			return pairs, true
		}
		k := i
		for i < len(s) && s[i] != '=' && !blank(s[i]) {
			i++
		}
		key := s[k:i]
		for i < len(s) && blank(s[i]) {
			i++
		}
		if key == "" || i == len(s) || s[i] != '=' {
			return nil, false
		}
		i++
		for i < len(s) && blank(s[i]) {
			i++
		}
		v := i
		if i < len(s) && s[i] == '\'' {
			for i++; i < len(s) && s[i] != '\''; i++ {
				if s[i] == '\\' {
					i++
				}
			}
			if i >= len(s) {
				return nil, false // unterminated quote
			}
			i++
		} else {
			for i < len(s) && !blank(s[i]) {
				if s[i] == '\\' {
					i++
				}
				i++
			}
			i = min(i, len(s))
		}
		pairs = append(pairs, [2]string{key, s[v:i]})
	}
}
