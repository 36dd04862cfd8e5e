package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/gobuild"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/progrun"
	"github.com/pepsi-pipeline/pepsi/store"
)

// pepsi is the binary under test, built once per test run.
var pepsi = gobuild.Once("cmd/pepsi-queue")

// TestMain removes the built binary after the tests.
func TestMain(m *testing.M) { pepsi.Main(m) }

// result is what one run of the binary did.
type result struct {
	code           int
	stdout, stderr string
}

// pq runs pepsi-queue with args, stdin and extra environment. PEPSI_DATABASE and
// the PG* variables of the test's own environment are not passed on.
func pq(t *testing.T, stdin string, env []string, args ...string) result {
	t.Helper()
	r := progrun.Run(t, progrun.Params{Path: pepsi.Path(t), Args: args, Stdin: stdin, Env: env,
		Drop: []string{"PEPSI_", "PG"}, Timeout: 60 * time.Second})
	return result{code: r.Code, stdout: r.Stdout, stderr: r.Stderr}
}

// migratedEnv makes a fresh migrated database and returns its URL and the
// environment that names it to pepsi-queue.
func migratedEnv(t *testing.T) (url string, env []string) {
	t.Helper()
	url = pgtest.NewMigrated(t)
	return url, []string{"PEPSI_DATABASE=" + url}
}

// expect fails the test unless r exited with code and its stdout and stderr
// contain the given texts.
func (r result) expect(t *testing.T, what string, code int, stdout, stderr string) {
	t.Helper()
	if r.code != code || !strings.Contains(r.stdout, stdout) || !strings.Contains(r.stderr, stderr) {
		t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d, stdout containing %q, stderr containing %q",
			what, r.code, r.stdout, r.stderr, code, stdout, stderr)
	}
}

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func scalar(t *testing.T, url, query string) string {
	t.Helper()
	var s string
	if err := pgtest.Connect(t, url).QueryRow(context.Background(), query).Scan(&s); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return s
}

func TestMigrateAppliesTheSchemaOnceThenHasNothingToDo(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	ms, err := store.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var applied []string
	for _, m := range ms {
		applied = append(applied, fmt.Sprintf("applied schema version %d", m.Version))
	}
	pq(t, "", nil, "-database", url, "migrate").expect(t, "first migrate", 0, strings.Join(applied, "\n"), "")
	pq(t, "", nil, "-database", url, "migrate").expect(t, "second migrate", 0,
		fmt.Sprintf("schema already at version %d; nothing to do", store.Latest()), "")
	if n := scalar(t, url, "SELECT count(*)::text FROM pepsi.schema_migrations"); n != fmt.Sprint(len(ms)) {
		t.Errorf("schema_migrations has %s rows, want %d", n, len(ms))
	}
	// A database a later build migrated (the programs rolled back): migrate
	// says the database's version, and that it is newer than its own.
	next := store.Latest() + 1
	scalar(t, url, fmt.Sprintf("INSERT INTO pepsi.schema_migrations (version, name) VALUES (%d, 'later') RETURNING 'ok'", next))
	pq(t, "", nil, "-database", url, "migrate").expect(t, "migrate of a newer schema", 0,
		fmt.Sprintf("schema already at version %d; nothing to do", next), fmt.Sprintf("newer than this build's %d", store.Latest()))
}

func TestEnqueueFromLinesSyntheticNDJSONAndPayload(t *testing.T) {
	t.Parallel()
	url, env := migratedEnv(t)
	pq(t, "a\nb\n\nc\n", env, "enqueue", "-stage", "parse", "-batch", "2").
		expect(t, "lines", 0, "enqueued 3 messages at stage parse: ids 1-3", "")
	pq(t, "", env, "enqueue", "-stage", "parse", "-n", "2500").
		expect(t, "synthetic", 0, "enqueued 2500 messages at stage parse: ids 4-2503", "")
	pq(t, `{"payload": "j", "state": {"src": "ndjson"}}`+"\n", env, "enqueue", "-stage", "enrich", "-ndjson").
		expect(t, "ndjson", 0, "enqueued 1 message at stage enrich: id 2504", "")
	pq(t, "", env, "enqueue", "-stage", "enrich", "-payload", "").
		expect(t, "empty -payload", 0, "enqueued 1 message at stage enrich: id 2505", "")

	got := scalar(t, url, `SELECT string_agg(ingress_id || ':' || stage || ':' || status || ':' || convert_from(payload, 'UTF8') || ':' || state::text, ' ' ORDER BY ingress_id)
		FROM pepsi.queue WHERE ingress_id IN (1, 2, 3, 4, 2503, 2504, 2505)`)
	want := `1:parse:pending:a:{} 2:parse:pending:b:{} 3:parse:pending:c:{} 4:parse:pending:synthetic message 1:{} ` +
		`2503:parse:pending:synthetic message 2500:{} 2504:enrich:pending:j:{"src": "ndjson"} 2505:enrich:pending::{}`
	if got != want {
		t.Errorf("rows =\n%s\nwant\n%s", got, want)
	}
}

func TestEnqueueRefusesStagesTheConfigurationDoesNotHave(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	file := writeFile(t, "pepsi.conf", "[pepsi]\nDATABASE = "+url+"\n[stage-parse]\nPROGRAM = p\n[stage-deliver]\nPROGRAM = d\n")
	pq(t, "", nil, "-c", file, "enqueue", "-stage", "prase", "-n", "1").
		expect(t, "unknown stage", 2, "", `-stage: stage "prase" is not in `+file+" (its stages: deliver, parse)")
	pq(t, "", nil, "-c", file, "enqueue", "-stage", "parse", "-n", "1").
		expect(t, "known stage, database from the configuration", 0, "enqueued 1 message", "")
	if n := scalar(t, url, "SELECT count(*)::text FROM pepsi.queue"); n != "1" {
		t.Errorf("queue has %s rows, want 1 (the refused enqueue must insert nothing)", n)
	}
	// Messages at a stage the file does not have (a typo's, a stage since
	// removed: no dispatcher runs them) are listed and discarded all the same.
	if _, err := pgtest.Connect(t, url).Exec(context.Background(), `INSERT INTO pepsi.queue (stage, payload) VALUES ('prase', 'x')`); err != nil {
		t.Fatal(err)
	}
	pq(t, "", nil, "-c", file, "list", "-stage", "prase", "-count").expect(t, "list a stage the file lacks", 0, "1", "")
	pq(t, "", nil, "-c", file, "discard", "-stage", "prase", "-n").expect(t, "discard a stage the file lacks", 0, "would discard 1 message", "")
}

func TestEnqueueUsageErrorsExitTwo(t *testing.T) {
	t.Parallel()
	env := []string{"PEPSI_DATABASE=postgres://127.0.0.1:1/none"}
	pq(t, "", env, "enqueue", "-n", "3").expect(t, "no -stage", 2, "", "-stage is required")
	pq(t, "", env, "enqueue", "-stage", "a", "-n", "3", "-ndjson").expect(t, "two modes", 2, "", "exclude each other")
	pq(t, "", env, "enqueue", "-stage", "a", "-n", "x").expect(t, "bad -n", 2, "", `invalid value "x" for flag -n`)
	pq(t, "", env, "enqueue", "-stage", "a", "extra").expect(t, "stray argument", 2, "", `unexpected arguments ["extra"]`)
	pq(t, "", env, "enqueue", "-stage", "a", "-n", "0").expect(t, "-n 0", 2, "", "-n 0: want a positive number")
	pq(t, "", env, "enqueue", "-stage", "a", "-n", "1", "-order-key", "").expect(t, "an empty order key", 2, "", "-order-key is empty")
	pq(t, "", env, "frobnicate").expect(t, "unknown subcommand", 2, "", `unknown subcommand "frobnicate"`)
	pq(t, "", nil, "-database", "postgres://%zz", "stats").expect(t, "malformed -database", 2, "", "database connection string")
	bad := writeFile(t, "bad.conf", "[pepsi]\nDATABASE = x\n[stage-a]\n")
	pq(t, "", nil, "-c", bad, "stats").expect(t, "bad configuration", 2, "", bad+":3: PROGRAM: [stage-a] has no PROGRAM")
}

func TestEnqueueStoppedByBadInputReportsWhatWasCommitted(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	input := `{"payload": "1"}` + "\n" + `{"payload": "2"}` + "\n" + `{"payload": 3, "oops": 1}` + "\n"
	pq(t, input, []string{"PEPSI_DATABASE=" + url}, "enqueue", "-stage", "parse", "-ndjson", "-batch", "1").
		expect(t, "bad third line", 1, "", `enqueue stopped after 2 messages (ids 1-2 committed): input line 3: unknown field "oops"`)
}

func TestStatsShowsCountsAndTheDispatcherStatistics(t *testing.T) {
	t.Parallel()
	url, env := migratedEnv(t)
	pq(t, "", env, "enqueue", "-stage", "parse", "-n", "5").expect(t, "enqueue", 0, "enqueued 5", "")
	_, err := pgtest.Connect(t, url).Exec(context.Background(), `
		UPDATE pepsi.queue SET status = 'done', stage = 'deliver' WHERE ingress_id <= 2;
		INSERT INTO pepsi.stage_stats (stage, processed, failed, crashes, processing_us, retries, rate_held_us) VALUES ('parse', 4, 1, 2, 8000, 3, 1500000);
		UPDATE pepsi.dispatch_stats SET stage_passes = 11, messages_left = 2`)
	if err != nil {
		t.Fatal(err)
	}
	r := pq(t, "", env, "stats")
	r.expect(t, "stats", 0, "DISPATCH: 11 stage passes, 2 messages left the pipeline", "")
	for _, re := range []string{
		`(?m)^deliver +0 +0 +0 +0 +2 +0 +0 +-$`,
		`(?m)^parse +3 +0 +0 +0 +0 +0 +0 +\d+s$`,
		`(?m)^total +3 +0 +0 +0 +2 +0 +0$`,
		`(?m)^parse +4 +1 +0 +2 +3 +1.5s +2ms +\d+s ago$`,
		// The names say what they count: a stage's own failures are not the dispatcher's.
		`(?m)^stage +passes ok +failed by dispatcher +watchdog timeouts +worker crashes +retries +rate-held +mean pass +updated$`,
		`(?m)^  passes ok: passes answered 0, including those in which the stage failed the message itself \(state.error\)$`,
	} {
		if !regexp.MustCompile(re).MatchString(r.stdout) {
			t.Errorf("stats output has no line matching %s:\n%s", re, r.stdout)
		}
	}
}

func TestShowPrintsOneMessage(t *testing.T) {
	t.Parallel()
	url, env := migratedEnv(t)
	pq(t, `{"payload": "hello", "state": {"k": "v"}}`+"\n", env, "enqueue", "-stage", "parse", "-ndjson").expect(t, "enqueue", 0, "id 1", "")
	r := pq(t, "", env, "show", "1")
	r.expect(t, "show", 0, "stage     parse\nstatus    pending\nattempts  0\npayload   5 bytes\n", "")
	r.expect(t, "show state", 0, "state\n{\n  \"k\": \"v\"\n}\n", "")
	pq(t, "", env, "show", "-payload", "1").expect(t, "show -payload", 0, "hello", "")
	// A row a stage paused for good ('infinity', which no time.Time holds).
	if _, err := pgtest.Connect(t, url).Exec(context.Background(), `UPDATE pepsi.queue SET status = 'paused', timeout = 'infinity' WHERE ingress_id = 1`); err != nil {
		t.Fatal(err)
	}
	pq(t, "", env, "show", "1").expect(t, "show paused until infinity", 0, "status    paused\ntimeout   infinity (never due)\n", "")
	if _, err := pgtest.Connect(t, url).Exec(context.Background(), `UPDATE pepsi.queue SET timeout = '-infinity' WHERE ingress_id = 1`); err != nil {
		t.Fatal(err)
	}
	pq(t, "", env, "show", "1").expect(t, "show paused until -infinity", 0, "status    paused\ntimeout   -infinity (due)\n", "")
	// A message that ran since its last pause keeps that timeout in its row: it
	// is no due time any more, and show does not print it.
	if _, err := pgtest.Connect(t, url).Exec(context.Background(), `UPDATE pepsi.queue SET status = 'failed', timeout = now() - interval '1 minute' WHERE ingress_id = 1`); err != nil {
		t.Fatal(err)
	}
	if r := pq(t, "", env, "show", "1"); r.code != 0 || strings.Contains(r.stdout, "timeout") {
		t.Errorf("show of a failed message with a stale timeout: exit %d, stdout %q; want exit 0 and no timeout line", r.code, r.stdout)
	}
	// Its retries at the stage, and the producer's key.
	if _, err := pgtest.Connect(t, url).Exec(context.Background(), `UPDATE pepsi.queue SET attempts = 2, dedup_key = 'order-7' WHERE ingress_id = 1`); err != nil {
		t.Fatal(err)
	}
	pq(t, "", env, "show", "1").expect(t, "show attempts and key", 0, "attempts  2\nkey       order-7\n", "")
	pq(t, "", env, "show", "7").expect(t, "missing", 1, "", "message 7 does not exist")
	pq(t, "", env, "show", "x7").expect(t, "bad id", 2, "", `"x7" is not a message id`)
	pq(t, "", env, "show").expect(t, "no id", 2, "", "want exactly one message id")
}

func TestRetryThenPurgeEndToEnd(t *testing.T) {
	t.Parallel()
	url, env := migratedEnv(t)
	pq(t, "", env, "enqueue", "-stage", "parse", "-n", "6").expect(t, "enqueue", 0, "ids 1-6", "")
	_, err := pgtest.Connect(t, url).Exec(context.Background(), `
		UPDATE pepsi.queue SET status = 'failed', state = '{"dispatch_error": "exit 3"}' WHERE ingress_id IN (1, 2);
		UPDATE pepsi.queue SET status = 'timeout', stage = 'deliver' WHERE ingress_id = 3;
		UPDATE pepsi.queue SET status = 'done', updated_at = now() - interval '3 days' WHERE ingress_id IN (4, 5)`)
	if err != nil {
		t.Fatal(err)
	}
	pq(t, "", env, "retry").expect(t, "retry without a filter", 2, "", "no filter given")
	pq(t, "", env, "retry", "-status", "done").expect(t, "retry done", 2, "", `-status "done": want failed or timeout`)
	pq(t, "", env, "retry", "-id", "4").expect(t, "retry a done message", 1, "", "message 4 was not retried")
	pq(t, "", env, "retry", "-id", "4", "-n").expect(t, "dry run of a done message", 1, "", "message 4 would not be retried")
	pq(t, "", env, "retry", "-id", "1", "-stage", "nosuch", "-n").expect(t, "retry -id beside another filter", 1, "", "or does not match the other filters")
	pq(t, "", env, "retry", "-stage", "\xff").expect(t, "a stage that is not UTF-8", 2, "", "-stage")
	pq(t, "", env, "retry", "-id", "1").expect(t, "retry one", 0, "retried 1 message: pending again", "")
	pq(t, "", env, "retry", "-status", "timeout", "-to", "parse").expect(t, "retry timeouts", 0, "retried 1 message", "")
	pq(t, "", env, "retry", "-all").expect(t, "retry the rest", 0, "retried 1 message", "")
	got := scalar(t, url, `SELECT string_agg(ingress_id || ':' || stage || ':' || status || ':' || (state->'dispatch_error_history'->0->>'status'), ' ' ORDER BY ingress_id)
		FROM pepsi.queue WHERE ingress_id <= 3`)
	if want := "1:parse:pending:failed 2:parse:pending:failed 3:parse:pending:timeout"; got != want {
		t.Errorf("retried rows = %s, want %s", got, want)
	}

	pq(t, "", env, "purge").expect(t, "purge without age", 2, "", "-older-than is required")
	pq(t, "", env, "purge", "-older-than", "2w").expect(t, "purge bad age", 2, "", `"2w" is not an age`)
	pq(t, "", env, "purge", "-older-than", "4d").expect(t, "purge nothing that old", 0, "purged 0 messages", "")
	pq(t, "", env, "purge", "-older-than", "2d", "-n").expect(t, "purge -n", 0, "would purge 2 messages unchanged for 2d (nothing deleted: -n)", "")
	pq(t, "", env, "purge", "-older-than", "2d", "-status", "failed", "-n").expect(t, "purge -n of failed only", 0, "would purge 0 messages", "")
	pq(t, "", env, "purge", "-older-than", "2d", "-batch", "1").expect(t, "purge", 0, "purged 2 messages unchanged for 2d", "")
	if got := scalar(t, url, "SELECT string_agg(ingress_id::text, ',' ORDER BY ingress_id) FROM pepsi.queue"); got != "1,2,3,6" {
		t.Errorf("rows after purge = %s, want 1,2,3,6", got)
	}
}

func TestUnreachableDatabaseIsNamedAndExitsOne(t *testing.T) {
	t.Parallel()
	r := pq(t, "", []string{"PEPSI_DATABASE=postgres://pepsi@127.0.0.1:1/queue?connect_timeout=2"}, "stats")
	r.expect(t, "unreachable", 1, "", `connect to PostgreSQL at 127.0.0.1:1 (database "queue", user "pepsi")`)
	// -database beats PEPSI_DATABASE.
	r = pq(t, "", []string{"PEPSI_DATABASE=postgres://a@127.0.0.1:1/x"}, "-database", "postgres://b@127.0.0.1:2/y?connect_timeout=2", "stats")
	r.expect(t, "flag over environment", 1, "", "127.0.0.1:2")
}

// An exported PEPSI_DATABASE that overrides the -c file's DATABASE is said on
// standard error: otherwise the operator acts on another database than the
// file's without a word. -database on the command line is the operator's own
// choice, and a variable that names the file's own database changes nothing.
func TestTheEnvironmentOverridingTheFilesDatabaseIsWarnedOf(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	file := writeFile(t, "pepsi.conf", "[pepsi]\nDATABASE = postgres://nobody@127.0.0.1:1/none?connect_timeout=2\n[stage-parse]\nPROGRAM = x\n")
	warning := "pepsi-queue: warning: PEPSI_DATABASE (" + url + ") overrides [pepsi] DATABASE of " + file + "\n"
	r := pq(t, "", []string{"PEPSI_DATABASE=" + url}, "-c", file, "stats")
	r.expect(t, "PEPSI_DATABASE over -c", 0, "", warning)
	r = pq(t, "", nil, "-c", file, "-database", url, "stats")
	if r.code != 0 || strings.Contains(r.stderr, "warning") {
		t.Errorf("-database over -c: exit %d, stderr %q; want 0 and no warning", r.code, r.stderr)
	}
	same := writeFile(t, "pepsi.conf", "[pepsi]\nDATABASE = "+url+"\n[stage-parse]\nPROGRAM = x\n")
	if r = pq(t, "", []string{"PEPSI_DATABASE=" + url}, "-c", same, "stats"); r.code != 0 || r.stderr != "" {
		t.Errorf("PEPSI_DATABASE naming the file's own database: exit %d, stderr %q; want 0 and nothing", r.code, r.stderr)
	}
}

func TestHelpTeachesWithExamples(t *testing.T) {
	t.Parallel()
	pq(t, "", nil, "--help").expect(t, "--help", 0, "EXAMPLES\n  pepsi-queue -c /etc/pepsi/pepsi.conf migrate", "")
	for _, sub := range []string{"migrate", "enqueue", "stats", "show", "list", "retry", "discard", "purge"} {
		r := pq(t, "", nil, sub, "-h")
		r.expect(t, sub+" -h", 0, "EXAMPLE", "")
		r.expect(t, sub+" -h", 0, "pepsi-queue [global flags] "+sub, "")
	}
	pq(t, "", nil).expect(t, "no subcommand", 2, "", "no subcommand given")
}

func TestADatabaseWithoutTheSchemaSaysToMigrate(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	for _, sub := range []string{"stats", "show 1", "retry -all"} {
		pq(t, "", nil, append([]string{"-database", url}, strings.Fields(sub)...)...).
			expect(t, sub+" on a database without the schema", 1, "", "run pepsi-queue migrate")
	}
}

func TestAFlagBeforeTheSubcommandIsCalledGlobal(t *testing.T) {
	t.Parallel()
	r := pq(t, "", nil, "-bogus", "stats")
	want := "pepsi-queue: unknown global flag -bogus (the global flags, before the subcommand, are -c, -database and -version)\nRun 'pepsi-queue -h' for help.\n"
	if r.code != 2 || r.stderr != want {
		t.Errorf("-bogus stats: exit %d, stderr %q; want 2 and %q (not blamed on stats)", r.code, r.stderr, want)
	}
	pq(t, "", nil, "-stage", "parse", "enqueue").
		expect(t, "a subcommand's flag too early", 2, "", "unknown global flag -stage (the global flags, before the subcommand, are -c, -database and -version; -stage is a flag of enqueue, list, retry and discard: put it after the subcommand)")
	pq(t, "", nil, "-c").expect(t, "a global flag without its value", 2, "", "pepsi-queue: global flag needs an argument: -c")
	// After the subcommand the flag is the subcommand's, even when a flag's value is
	// a subcommand's name.
	pq(t, "", nil, "-c", "stats", "show", "-bogus").expect(t, "show -bogus", 2, "", "pepsi-queue show: flag provided but not defined: -bogus\nRun 'pepsi-queue show -h' for help.")
}

// A new user's first look: stats lists every stage of the -c file, the empty
// ones too, and says "never" for statistics no dispatcher has flushed yet.
func TestStatsListsEveryConfiguredStageAndNeverForNoFlush(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	cfg := writeFile(t, "pepsi.conf", "[pepsi]\nDATABASE = "+url+"\n[stage-parse]\nPROGRAM = x\n[stage-deliver]\nPROGRAM = x\n")
	r := pq(t, "", nil, "-c", cfg, "stats")
	r.expect(t, "stats of an empty queue", 0, "messages left the pipeline (updated never)", "")
	for _, re := range []string{
		`(?m)^deliver +0 +0 +0 +0 +0 +0 +0 +-$`,
		`(?m)^parse +0 +0 +0 +0 +0 +0 +0 +-$`,
		`(?m)^deliver +0 +0 +0 +0 +0 +0s +- +never$`,
		`(?m)^parse +0 +0 +0 +0 +0 +0s +- +never$`,
	} {
		if !regexp.MustCompile(re).MatchString(r.stdout) {
			t.Errorf("stats output has no line matching %s:\n%s", re, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "0s ago") {
		t.Errorf("stats says \"0s ago\" where nothing was ever flushed:\n%s", r.stdout)
	}
}

// A global flag given after the subcommand is named as such, with where it goes.
func TestAGlobalFlagAfterTheSubcommandSaysWhereItGoes(t *testing.T) {
	t.Parallel()
	pq(t, "", nil, "stats", "-c", "pepsi.conf").expect(t, "stats -c FILE", 2, "",
		"pepsi-queue stats: -c is a global flag: put it before the subcommand (pepsi-queue -c FILE stats)\nRun 'pepsi-queue stats -h' for help.")
}

// Every failure names the server and database it was about, and says when they
// came from the libpq environment rather than from a flag or a file.
func TestErrorsNameTheDatabaseAndWhereItCameFrom(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t) // no schema
	u, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"PGHOST=" + u.Host, fmt.Sprintf("PGPORT=%d", u.Port), "PGUSER=" + u.User, "PGDATABASE=" + u.Database, "PGSSLMODE=disable"}
	pq(t, "", env, "stats").expect(t, "stats from the libpq environment", 1, "",
		fmt.Sprintf(`run pepsi-queue migrate) [database %q on %s:%d as user %q; taken from the libpq environment: no -c, -database or PEPSI_DATABASE was given]`,
			u.Database, u.Host, u.Port, u.User))
	// With -c: the file has no DATABASE, which is what to mend.
	conf := writeFile(t, "nodb.conf", "[pepsi]\n[stage-a]\nPROGRAM = /bin/true\n")
	pq(t, "", env, "-c", conf, "stats").expect(t, "stats with a file without DATABASE", 1, "",
		fmt.Sprintf(`taken from the libpq environment: %s has no [pepsi] DATABASE, and no -database or PEPSI_DATABASE was given]`, conf))
	// A database that does not exist: how to create it, with its own names.
	missing := strings.Replace(url, "/"+u.Database, "/"+u.Database+"_missing", 1)
	pq(t, "", nil, "-database", missing, "migrate").expect(t, "migrate into a missing database", 1, "",
		fmt.Sprintf("(create it first: createdb -h %s -p %d -U %s %s_missing; then pepsi-queue migrate)", u.Host, u.Port, u.User, u.Database))
	// A refused connection is one line, and the refusal is said once.
	r := pq(t, "", nil, "-database", "postgres://pepsi@127.0.0.1:1/queue?connect_timeout=2", "stats")
	if strings.Count(r.stderr, "\n") != 1 || strings.Count(r.stderr, "connection refused") != 1 {
		t.Errorf("refused connection: stderr %q; want one line that says \"connection refused\" once", r.stderr)
	}
}

// stats prints what pepsi-dispatch recorded of each stage's workers: the
// state, since when, the reason and when a stage that cannot start tries
// next, saying whether a dispatcher holds the lock (without one the rows are
// what the last one left).
func TestStatsShowsTheStagesHealth(t *testing.T) {
	t.Parallel()
	url, env := migratedEnv(t)
	pq(t, "", env, "stats").expect(t, "stats before any dispatcher", 0, "HEALTH: none recorded", "")
	_, err := pgtest.Connect(t, url).Exec(context.Background(), `
		INSERT INTO pepsi.stage_health (stage, state, reason, until, since) VALUES
			('parse', 'cannot_start', 'program "/no/such" cannot start: exec: no such file; starts held back 4s after each failure', now() + interval '3 s', now() - interval '110 s'),
			('deliver', 'ok', '', NULL, now() - interval '1 hour')`)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	lock, err := store.TryLock(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := pq(t, "", env, "stats")
	r.expect(t, "stats with a dispatcher", 0, "HEALTH (recorded by pepsi-dispatch: pepsi.stage_health)", "")
	for _, re := range []string{
		`(?m)^parse +cannot_start +1m5\ds ago +program "/no/such" cannot start: exec: no such file; starts held back 4s after each failure; next try in [23]s$`,
		`(?m)^deliver +ok +1h0m\ds ago +-$`,
	} {
		if !regexp.MustCompile(re).MatchString(r.stdout) {
			t.Errorf("stats output has no line matching %s:\n%s", re, r.stdout)
		}
	}
	if err := lock.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	pq(t, "", env, "stats").expect(t, "stats without a dispatcher", 0, "HEALTH (as the last pepsi-dispatch left it: no dispatcher holds the lock, so nothing runs now)", "")
}
