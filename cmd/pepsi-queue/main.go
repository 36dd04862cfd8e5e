// Command pepsi-queue is the operator's tool for the PEPSI queue: it applies the
// schema, enqueues messages, shows counts, statistics and single messages, sends
// failed messages round again and purges finished ones. Its SQL lives in
// queueadmin; this file parses flags and prints. It never claims or runs
// messages (pepsi-dispatch alone does) and never writes the statistics tables.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/peterbourgon/ff/v3"
	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/internal/buildinfo"
	"github.com/pepsi-pipeline/pepsi/internal/cliflags"
	"github.com/pepsi-pipeline/pepsi/internal/logflags"
	"github.com/pepsi-pipeline/pepsi/internal/pgaddr"
	"github.com/pepsi-pipeline/pepsi/queueadmin"
)

func main() {
	cliflags.Main(func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
		return run(ctx, args, os.Stdin, stdout, stderr)
	})
}

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// usageError is a mistake on the command line: exit 2, with a pointer to -h.
type usageError struct {
	cmd string
	msg string
}

func (e *usageError) Error() string { return e.msg }

func usagef(cmd, format string, args ...any) error {
	return &usageError{cmd: cmd, msg: fmt.Sprintf(format, args...)}
}

// app is what every subcommand shares: the global flags and the standard streams.
type app struct {
	configFile string
	database   string
	version    bool
	stdin      io.Reader
	stdout     io.Writer
	stderr     io.Writer
	config     *conf.Config // loaded by setup when -c is given
	// db is the connection configuration connect tried, and dbFromEnv says it
	// came from the libpq environment alone: every error after connect names
	// it, since an operator must see which server and database a failure is about.
	db        *pgx.ConnConfig
	dbFromEnv bool
	// databaseOnLine says the command line gave -database: a value of
	// a.database without it came from PEPSI_DATABASE.
	databaseOnLine bool
}

const rootHelp = `pepsi-queue inspects and manages the PEPSI queue, the table pepsi.queue in
PostgreSQL: it applies the schema, puts messages in, shows counts, statistics and
single messages, lists messages by stage, status, reason and age, sends failed
messages round again, discards waiting ones and purges finished ones. It never
runs messages: pepsi-dispatch does.

Global flags go before the subcommand. The database is -database, else
$PEPSI_DATABASE, else [pepsi] DATABASE of the -c file, else the libpq PG*
environment (PGHOST, PGDATABASE, ...). With -c, stage names are checked against
the file's [stage-NAME] sections.

EXAMPLES
  pepsi-queue -c /etc/pepsi/pepsi.conf migrate    apply or upgrade the schema
  seq 1 100 | pepsi-queue enqueue -stage parse    one message per input line
  pepsi-queue enqueue -stage parse -n 10000       10000 synthetic messages
  pepsi-queue enqueue -stage parse -ndjson < m.ndjson
  pepsi-queue enqueue -stage parse -payload 'order=1 amount=12.50'
  pepsi-queue stats                               what is where, and throughput
  pepsi-queue show 42                             one message, with its state
  pepsi-queue list -status failed                 failed messages, with their reasons
  pepsi-queue retry -stage deliver -status timeout
  pepsi-queue discard -stage deliver -status paused -n
  pepsi-queue purge -older-than 7d                delete old finished messages

Each subcommand explains itself: pepsi-queue enqueue -h.

EXIT STATUS
  0 success; 1 failure (database unreachable, no such message, ...);
  2 bad command line or configuration.`

// newRoot builds the command tree around a.
func newRoot(a *app, parseOut io.Writer) *ffcli.Command {
	fs := flag.NewFlagSet("pepsi-queue", flag.ContinueOnError)
	fs.SetOutput(parseOut)
	fs.StringVar(&a.configFile, "c", "", "pepsi.conf `FILE` (for [pepsi] DATABASE and the stage names)")
	fs.StringVar(&a.database, "database", "", "PostgreSQL `URL` or key=value string (env PEPSI_DATABASE)")
	fs.BoolVar(&a.version, "version", false, "print the program's version and exit")
	root := &ffcli.Command{
		Name:       "pepsi-queue",
		ShortUsage: "pepsi-queue [-c FILE] [-database URL] <subcommand> [flags] [args]",
		LongHelp:   rootHelp,
		FlagSet:    fs,
		Options:    []ff.Option{ff.WithEnvVarPrefix("PEPSI")},
		Exec: func(_ context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("", "unknown subcommand %q (want migrate, enqueue, stats, show, history, list, retry, discard or purge)", args[0])
			}
			return usagef("", "no subcommand given (want migrate, enqueue, stats, show, history, list, retry, discard or purge)")
		},
	}
	root.Subcommands = []*ffcli.Command{
		migrateCmd(a), enqueueCmd(a), statsCmd(a), showCmd(a), historyCmd(a), listCmd(a), retryCmd(a), discardCmd(a), purgeCmd(a),
	}
	for _, sub := range root.Subcommands {
		sub.FlagSet.SetOutput(parseOut)
	}
	return root
}

// run is the whole program; it returns the exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	// The flag package writes help and its own errors (followed by the whole
	// usage) while parsing: collect them, so that asked-for help goes to stdout and
	// a mistake gets one line and a pointer to the help.
	var parseOut bytes.Buffer
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr, databaseOnLine: givesDatabase(args)}
	root := newRoot(a, &parseOut)
	if err := root.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			stdout.Write(parseOut.Bytes()) //nolint:errcheck // nothing to do if stdout is gone
			return exitOK
		}
		msg := err.Error()
		if first, _, _ := strings.Cut(parseOut.String(), "\n"); first != "" {
			msg = first
		}
		// The flag set that failed is the last one parsing began on: ffcli parses
		// a subcommand's flags only after the global ones. An argument's spelling
		// cannot say it: "pepsi-queue -bogus stats" fails before stats.
		name := "pepsi-queue"
		for _, sub := range root.Subcommands {
			if sub.FlagSet.Parsed() {
				name += " " + sub.Name
			}
		}
		if name == "pepsi-queue" {
			msg = globalFlagError(root, msg)
		} else {
			msg = lateGlobalFlag(root, name, msg)
		}
		fmt.Fprintf(stderr, "%s: %s\nRun '%s -h' for help.\n", name, msg, name)
		return exitUsage
	}
	if a.version {
		fmt.Fprintln(stdout, buildinfo.Version("pepsi-queue"))
		return exitOK
	}
	err := root.Run(ctx)
	if err == nil {
		return exitOK
	}
	var ue *usageError
	if errors.As(err, &ue) {
		name := "pepsi-queue"
		if ue.cmd != "" {
			name += " " + ue.cmd
		}
		fmt.Fprintf(stderr, "%s: %s\nRun '%s -h' for help.\n", name, ue.msg, name)
		return exitUsage
	}
	fmt.Fprintf(stderr, "pepsi-queue: %s%s%s\n", logflags.OneLine(err.Error()), schemaHint(err, a.db), a.where(err))
	return exitFailure
}

// givesDatabase reports whether args, a command line, gives -database.
func givesDatabase(args []string) bool {
	for _, arg := range args {
		if arg == "--" {
			return false
		}
		name, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if strings.HasPrefix(arg, "-") && name == "database" {
			return true
		}
	}
	return false
}

// where names the database an error is about: the server, database and user
// connect tried (a failed connection's error names them already), and whether
// they came from the libpq environment alone, which no flag or file names.
func (a *app) where(err error) string {
	if a.db == nil {
		return ""
	}
	var parts []string
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		parts = append(parts, fmt.Sprintf("database %q on %s:%d as user %q", pgaddr.Database(&a.db.Config), a.db.Host, a.db.Port, a.db.User))
	}
	switch {
	case a.dbFromEnv && a.config != nil:
		parts = append(parts, fmt.Sprintf("taken from the libpq environment: %s has no [pepsi] DATABASE, and no -database or PEPSI_DATABASE was given", a.configFile))
	case a.dbFromEnv:
		parts = append(parts, "taken from the libpq environment: no -c, -database or PEPSI_DATABASE was given")
	}
	if len(parts) == 0 {
		return ""
	}
	return " [" + strings.Join(parts, "; ") + "]"
}

// lateGlobalFlag rewrites msg, the flag package's complaint about a flag of
// subcommand name (as "pepsi-queue stats"), when that flag is a global one
// given after the subcommand: it says where the flag goes.
func lateGlobalFlag(root *ffcli.Command, name, msg string) string {
	unknown, ok := strings.CutPrefix(msg, "flag provided but not defined: ")
	if !ok || root.FlagSet.Lookup(strings.TrimLeft(unknown, "-")) == nil {
		return msg
	}
	arg, _ := flag.UnquoteUsage(root.FlagSet.Lookup(strings.TrimLeft(unknown, "-")))
	sub := strings.TrimPrefix(name, "pepsi-queue ")
	return fmt.Sprintf("%s is a global flag: put it before the subcommand (pepsi-queue %s %s %s)", unknown, unknown, arg, sub)
}

// globalFlagError rewrites msg, the flag package's complaint about a flag before
// the subcommand, to say that it is about a global flag, which the global flags
// are, and, for a subcommand's flag given too early, that it goes after.
func globalFlagError(root *ffcli.Command, msg string) string {
	var globals []string
	root.FlagSet.VisitAll(func(f *flag.Flag) { globals = append(globals, "-"+f.Name) })
	where := fmt.Sprintf("the global flags, before the subcommand, are %s", andList(globals))
	unknown, ok := strings.CutPrefix(msg, "flag provided but not defined: ")
	if !ok {
		return strings.Replace(msg, "flag ", "global flag ", 1) + " (" + where + ")"
	}
	var takers []string
	for _, sub := range root.Subcommands {
		if sub.FlagSet.Lookup(strings.TrimLeft(unknown, "-")) != nil {
			takers = append(takers, sub.Name)
		}
	}
	if len(takers) > 0 {
		where += fmt.Sprintf("; %s is a flag of %s: put it after the subcommand", unknown, andList(takers))
	}
	return fmt.Sprintf("unknown global flag %s (%s)", unknown, where)
}

// andList joins words as a sentence lists them: "a", "a and b", "a, b and c".
func andList(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " and " + words[len(words)-1]
}

// schemaHint tells an operator what to do about a database without the PEPSI
// schema (a missing table or schema), which PostgreSQL reports as a bare
// "relation does not exist", or about a database that does not exist (db is
// the configuration connect tried, nil before it).
func schemaHint(err error, db *pgx.ConnConfig) string {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return ""
	}
	switch {
	case (pg.Code == "42P01" || pg.Code == "3F000") && strings.Contains(pg.Message, "pepsi"): // undefined_table, invalid_schema_name
		return " (the database has no PEPSI schema: run pepsi-queue migrate)"
	case pg.Code == "42703": // undefined_column: every query is of pepsi's tables
		return " (the database has an older PEPSI schema: run pepsi-queue migrate)"
	case pg.Code == "3D000" && db != nil: // invalid_catalog_name: the database does not exist
		return fmt.Sprintf(" (create it first: createdb -h %s -p %d -U %s %s; then pepsi-queue migrate)", db.Host, db.Port, db.User, pgaddr.Database(&db.Config))
	}
	return ""
}

// loadConfig reads the -c file, if any. A bad file is a usage error: the
// operator must fix it before anything can work.
func (a *app) loadConfig() error {
	if a.configFile == "" || a.config != nil {
		return nil
	}
	text, err := os.ReadFile(a.configFile)
	if err != nil {
		return usagef("", "configuration: %v", err)
	}
	c, err := conf.Parse(a.configFile, string(text))
	if err != nil {
		return usagef("", "configuration: %v", err)
	}
	a.config = c
	return nil
}

// connect loads the configuration and opens the database it names.
func (a *app) connect(ctx context.Context) (*pgx.Conn, error) {
	if err := a.loadConfig(); err != nil {
		return nil, err
	}
	url := a.database
	if url == "" && a.config != nil {
		url = a.config.Database
	}
	if a.database != "" && !a.databaseOnLine && a.config != nil && a.config.Database != "" && a.config.Database != a.database {
		// An exported PEPSI_DATABASE (as for the demo) would otherwise point
		// the command at another database than its -c file's without a word.
		fmt.Fprintf(a.stderr, "pepsi-queue: warning: PEPSI_DATABASE (%s) overrides [pepsi] DATABASE of %s\n", cliflags.Redact(a.database), a.configFile)
	}
	// A connection string that does not parse is a mistake in the command line
	// or the configuration (exit 2), not a failure of the database (exit 1).
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, usagef("", "database connection string: %v", err)
	}
	a.db, a.dbFromEnv = cfg, url == ""
	return queueadmin.Connect(ctx, url)
}

// checkStage refuses a stage the configuration does not have, or, without
// one, a name no configuration could give a stage: a message sent there
// would wait forever.
func (a *app) checkStage(cmd, flagName, stage string) error {
	if err := a.loadConfig(); err != nil {
		return err
	}
	if a.config == nil {
		if !conf.ValidStageName(stage) {
			return usagef(cmd, "%s: %q is not a stage name (1 to 63 letters, digits, '_' and '-'; not done or paused): no dispatcher would ever take its messages", flagName, stage)
		}
		return nil
	}
	if _, ok := a.config.Stage(stage); ok {
		return nil
	}
	names := make([]string, len(a.config.Stages))
	for i, s := range a.config.Stages {
		names[i] = s.Name
	}
	return usagef(cmd, "%s: stage %q is not in %s (its stages: %s)", flagName, stage, a.configFile, strings.Join(names, ", "))
}

// withConn connects, runs f, and closes the connection.
func (a *app) withConn(ctx context.Context, f func(conn *pgx.Conn) error) error {
	conn, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return f(conn)
}
