package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/peterbourgon/ff/v3/ffcli"
	"golang.org/x/term"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/queueadmin"
	"github.com/pepsi-pipeline/pepsi/store"
)

func newFlags(name string) *flag.FlagSet {
	return flag.NewFlagSet("pepsi-queue "+name, flag.ContinueOnError)
}

func noArgs(cmd string, args []string) error {
	if len(args) > 0 {
		return usagef(cmd, "unexpected arguments %q", args)
	}
	return nil
}

func migrateCmd(a *app) *ffcli.Command {
	fs := newFlags("migrate")
	lockWait := fs.Duration("lock-wait", store.DefaultMigrateOptions.LockWait,
		"give up a migration's first try when a lock it needs is held longer than this, each later try waiting twice as long, up to 32 times it (0: wait as long as it takes)")
	lockTries := fs.Int("lock-tries", store.DefaultMigrateOptions.Tries,
		"tries of a migration whose lock wait ran out, each after a pause of -lock-wait")
	return &ffcli.Command{
		Name:       "migrate",
		ShortUsage: "pepsi-queue [global flags] migrate [-lock-wait DURATION] [-lock-tries N]",
		ShortHelp:  "apply or upgrade the pepsi schema (safe to run again)",
		LongHelp: `Applies the embedded schema migrations that the database does not have yet,
each in its own transaction, under an advisory lock, and prints the versions it
applied. Running it again changes nothing. pepsi-dispatch never applies the
schema itself: run this once per database, and after each upgrade.

A migration that needs a lock on pepsi.queue waits for the transactions using
the table, and every insert and claim queues behind it. So its first try waits
at most -lock-wait for a lock, then rolls back, pauses as long, and starts
again, each try waiting twice as long as the one before (up to 32 times
-lock-wait), up to -lock-tries times; then migrate fails, at the version
before, naming the migration.

EXAMPLE
  pepsi-queue -database postgres://pepsi@db/pepsi migrate`,
		FlagSet: fs,
		Exec: func(ctx context.Context, args []string) error {
			if err := noArgs("migrate", args); err != nil {
				return err
			}
			if *lockWait < 0 || *lockTries < 1 {
				return usagef("migrate", "-lock-wait must be 0 or more and -lock-tries 1 or more")
			}
			opts := store.MigrateOptions{LockWait: *lockWait, Tries: *lockTries}
			return a.withConn(ctx, func(conn *pgx.Conn) error {
				applied, err := store.MigrateWith(ctx, conn, store.Latest(), opts)
				if err != nil {
					return err
				}
				if len(applied) == 0 {
					// The database's version, which may be above this
					// build's latest after a rollback of the programs.
					v, err := store.Version(ctx, conn)
					if err != nil {
						return err
					}
					fmt.Fprintf(a.stdout, "schema already at version %d; nothing to do\n", v)
					if v > store.Latest() {
						fmt.Fprintf(a.stderr, "pepsi-queue: warning: the database's schema %d is newer than this build's %d: these programs may not know what it holds\n", v, store.Latest())
					}
					return nil
				}
				for _, v := range applied {
					fmt.Fprintf(a.stdout, "applied schema version %d\n", v)
				}
				return nil
			})
		},
	}
}

// enqueueHelp is enqueue's long help.
const enqueueHelp = `Adds messages to the queue at -stage (pending, or paused when scheduled), in
input order, and prints the range of ids they got. By default every non-empty line of standard input is
one message (the line without its newline is the payload). With -ndjson every
line is a JSON object:
  {"payload": "text"}                    the string's bytes
  {"payload": {"any": "json"}}           a non-string payload is its JSON text
  {"payload_base64": "AAEC"}             binary payloads
  {"payload": "x", "state": {"k": 1}}    with an initial state object
  {"payload": "x", "order_key": "acct-9"} with an order key
  {"payload": "x", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
                                         with its W3C trace context
  {"payload": "x", "not_before": "2026-12-24T18:00:00Z"}
                                         scheduled: first handled at that time
Messages that share an order key (-order-key, or a line's order_key: 1 to 200
bytes) pass the pipeline one at a time, oldest first; a message whose key has
an unfinished message waits, blocked, behind it. Messages are inserted in batches (one statement and one commit each; the
dispatcher is woken once per batch), so a long input starts flowing at once. If
it fails midway, what was already committed stays, and the error says how much.
A message without a traceparent (-traceparent, or a line's) gets a fresh trace
at its first pass (docs/operations.md, "Traces"). A scheduled message
(-not-before, or a line's not_before) is inserted paused until its time and
is first claimed then, within the dispatcher's timer precision; one whose time
is not ahead of the database server's clock is pending at once. A duration
(-not-before 90s) counts from this machine's clock. One that
shares an order key holds its key until then (docs/protocol.md, "Scheduled
messages").

EXAMPLES
  seq 1 1000 | pepsi-queue -c /etc/pepsi/pepsi.conf enqueue -stage parse
  pepsi-queue enqueue -stage parse -n 10000
  jq -c '{payload: .body, state: {source: "import"}}' dump.json | pepsi-queue enqueue -stage parse -ndjson
  pepsi-queue enqueue -stage parse -payload 'order=1 amount=12.50'
  pepsi-queue enqueue -stage parse -order-key acct-9 -payload 'debit 12.50'
  pepsi-queue enqueue -stage remind -not-before 24h -payload 'cart 812 abandoned?'`

func enqueueCmd(a *app) *ffcli.Command {
	fs := newFlags("enqueue")
	stage := fs.String("stage", "", "the `STAGE` the messages start at (required)")
	n := fs.Int("n", 0, "enqueue `N` synthetic messages (\"synthetic message 1\", ...)")
	ndjson := fs.Bool("ndjson", false, "read NDJSON objects from standard input instead of plain lines")
	payload := fs.String("payload", "", "enqueue one message with this `TEXT` as its payload")
	batch := fs.Int("batch", 1000, "messages per INSERT (and per commit), at most 10000")
	orderKey := fs.String("order-key", "", "give every message this order `KEY` (an NDJSON line's order_key wins): they pass the pipeline one at a time, oldest first")
	traceParent := fs.String("traceparent", "", "give every message this W3C `TRACEPARENT` (00-<32 hex>-<16 hex>-<2 hex>; an NDJSON line's traceparent wins): its passes join that trace")
	notBefore := fs.String("not-before", "", "schedule every message: paused until `TIME`, an RFC 3339 time (2026-12-24T18:00:00Z) or a duration from now (90s, 2h); an NDJSON line's not_before wins")
	return &ffcli.Command{
		Name:       "enqueue",
		ShortUsage: "pepsi-queue [global flags] enqueue -stage STAGE [-n N | -ndjson | -payload TEXT] [-order-key KEY] [-traceparent TP] [-not-before TIME] [< input]",
		ShortHelp:  "add messages at a stage",
		LongHelp:   enqueueHelp,
		FlagSet:    fs,
		Exec: func(ctx context.Context, args []string) error {
			if err := noArgs("enqueue", args); err != nil {
				return err
			}
			if *stage == "" {
				return usagef("enqueue", "-stage is required")
			}
			// "-not-before $T" with T unset would run the messages now.
			// (An empty -order-key is refused by givenToAll, as a bad key.)
			if err := emptyFilters(fs, "enqueue", "not-before", "traceparent"); err != nil {
				return err
			}
			if err := textFlags("enqueue", "-stage", *stage); err != nil {
				return err
			}
			src, err := enqueueSource(a, fs, *n, *ndjson, *payload)
			if err != nil {
				return err
			}
			_, fromStdin := src.(*lines) // before givenToAll wraps it
			var at time.Time
			if *notBefore != "" {
				if at, err = notBeforeOf(*notBefore, time.Now()); err != nil {
					return err
				}
			}
			if src, err = givenToAll(src, *orderKey, *traceParent, at); err != nil {
				return err
			}
			if *batch <= 0 || *batch > queueadmin.EnqueueBatchMax {
				return usagef("enqueue", "-batch %d: want 1 to %d", *batch, queueadmin.EnqueueBatchMax)
			}
			if err := a.checkStage("enqueue", "-stage", *stage); err != nil {
				return err
			}
			if fromStdin && isTerminal(a.stdin) {
				fmt.Fprintln(a.stderr, "pepsi-queue: reading messages from the terminal, one per line; end with Ctrl-D")
			}
			return a.withConn(ctx, func(conn *pgx.Conn) error {
				if fromStdin {
					src = newInterruptible(ctx, src)
				}
				total, err := enqueueAll(ctx, conn, *stage, src, *batch)
				if total.Count == 0 && err == nil {
					fmt.Fprintf(a.stdout, "read no messages from standard input (it was empty or blank): 0 enqueued\n")
					return nil
				}
				if err != nil {
					if total.Count > 0 {
						return fmt.Errorf("enqueue stopped after %s (%s committed): %w", messages(total.Count), describeIDs(total), err)
					}
					return err
				}
				fmt.Fprintf(a.stdout, "enqueued %s at stage %s: %s\n", messages(total.Count), *stage, describeIDs(total))
				if total.Scheduled > 0 {
					fmt.Fprintf(a.stdout, "%s of them scheduled: paused until their not_before\n", messages(total.Scheduled))
				}
				return nil
			})
		},
	}
}

// enqueueSource is where enqueue's messages come from: -n synthetic ones, the
// one -payload, or standard input (plain lines, or NDJSON with -ndjson); only
// one of them.
func enqueueSource(a *app, fs *flag.FlagSet, n int, ndjson bool, payload string) (source, error) {
	modes := 0
	var src source = newLines(a.stdin, ndjson)
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["n"] {
		modes++
		src = &synthetic{n: n}
	}
	if ndjson {
		modes++
	}
	if set["payload"] {
		modes++
		src = &single{payload: []byte(payload)}
	}
	switch {
	case modes > 1:
		return nil, usagef("enqueue", "-n, -ndjson and -payload exclude each other")
	case set["n"] && n <= 0:
		return nil, usagef("enqueue", "-n %d: want a positive number", n)
	case set["order-key"] && fs.Lookup("order-key").Value.String() == "":
		return nil, usagef("enqueue", "-order-key is empty; leave it out for messages without one")
	}
	return src, nil
}

// isTerminal reports whether r is a terminal (so a user may be waiting for us).
// A character device is not enough: /dev/null is one, and reads as empty at once.
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// batchBytes ends a batch of enqueue early, once its payloads and states
// hold this many bytes: PostgreSQL refuses a statement whose parameters pass
// 1 GiB, and a batch of 1,000 messages of 16 MiB would, besides holding
// several times its size in memory while it is encoded.
const batchBytes = 64 << 20

// enqueueAll reads src to the end and inserts it in batches (inBatches),
// returning what was committed even when it fails.
func enqueueAll(ctx context.Context, conn *pgx.Conn, stage string, src source, batch int) (queueadmin.Range, error) {
	var total queueadmin.Range
	err := inBatches(src, batch, batchBytes, func(msgs []queueadmin.NewMessage) error {
		r, err := queueadmin.Enqueue(ctx, conn, stage, msgs)
		if err != nil {
			return err
		}
		if total.Count == 0 {
			total.First = r.First
		}
		total.First, total.Last = min(total.First, r.First), max(total.Last, r.Last)
		total.Count += r.Count
		total.Scheduled += r.Scheduled
		return nil
	})
	return total, err
}

// inBatches reads src to the end and hands its messages to flush in order, n
// at a time, or fewer once they hold maxBytes of payloads and states (a
// message larger than that goes alone). It stops at the first error.
func inBatches(src source, n, maxBytes int, flush func([]queueadmin.NewMessage) error) error {
	msgs := make([]queueadmin.NewMessage, 0, n)
	size := 0
	for {
		m, err := src.next()
		if errors.Is(err, io.EOF) {
			if len(msgs) == 0 {
				return nil
			}
			return flush(msgs)
		}
		if err != nil {
			return err
		}
		msgs = append(msgs, m)
		size += len(m.Payload) + len(m.State)
		if len(msgs) == n || size >= maxBytes {
			if err := flush(msgs); err != nil {
				return err
			}
			msgs, size = msgs[:0], 0
		}
	}
}

// messages is "1 message" or "N messages".
func messages(n int64) string {
	if n == 1 {
		return "1 message"
	}
	return fmt.Sprintf("%d messages", n)
}

func describeIDs(r queueadmin.Range) string {
	if r.Count == 1 {
		return fmt.Sprintf("id %d", r.First)
	}
	s := fmt.Sprintf("ids %d-%d", r.First, r.Last)
	if r.Last-r.First+1 != r.Count {
		s += " (not contiguous: something else inserted at the same time, or messages with an order key skipped ids)"
	}
	return s
}

func statsCmd(a *app) *ffcli.Command {
	return &ffcli.Command{
		Name:       "stats",
		ShortUsage: "pepsi-queue [global flags] stats",
		ShortHelp:  "counts per stage and status, and the dispatcher's statistics",
		LongHelp: `Prints how many messages each stage has in each status now, how long the
oldest pending message of each stage has waited, and the statistics
pepsi-dispatch flushes (every STATS_INTERVAL, when the pipeline goes idle, and
on shutdown): per stage, passes ok (passes answered 0, including those in which
the stage itself failed the message), messages failed by the dispatcher (a
non-zero answer, a crash, a protocol error), watchdog timeouts, worker crashes
and the mean pass time; overall, stage passes and messages that left the
pipeline. The queue's failed column counts every failed message, whoever failed
it, so it can be larger than "failed by dispatcher". The counts scan the whole
queue.

EXAMPLE
  watch -n 2 pepsi-queue -c /etc/pepsi/pepsi.conf stats`,
		FlagSet: newFlags("stats"),
		Exec: func(ctx context.Context, args []string) error {
			if err := noArgs("stats", args); err != nil {
				return err
			}
			return a.withConn(ctx, func(conn *pgx.Conn) error {
				s, err := queueadmin.ReadStats(ctx, conn)
				if err != nil {
					return err
				}
				var configured []string
				if a.config != nil {
					for _, st := range a.config.Stages {
						configured = append(configured, st.Name)
					}
				}
				printStats(a.stdout, s, configured, time.Now())
				return nil
			})
		},
	}
}

// printStats writes the stats tables. Every stage in configured (the -c
// file's) is listed, with zeros when it has no messages and no statistics yet,
// so a stage that is missing is told from one that is empty.
func printStats(w io.Writer, s *queueadmin.Stats, configured []string, now time.Time) {
	printDepth(w, s.Depth, configured)
	printKeys(w, s.Keys)
	printStageStats(w, s.Stages, configured, now)
	printHealth(w, s.Health)
	updated := time.Time{} // the row is made by migrate: its time means nothing until a flush
	if s.Dispatch.FlushSeq > 0 {
		updated = s.Dispatch.UpdatedAt
	}
	fmt.Fprintf(w, "\nDISPATCH: %d stage passes, %d messages left the pipeline (updated %s)\n",
		s.Dispatch.StagePasses, s.Dispatch.MessagesLeft, ago(updated, now))
}

// printDepth prints the QUEUE table: messages per stage and status now, every
// configured stage included, with the oldest pending wait.
func printDepth(w io.Writer, depth []queueadmin.Depth, configured []string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "QUEUE (messages per stage and status now; failed counts every failed message, whoever failed it)")
	statusColumns := core.RowStatuses()
	fmt.Fprint(tw, "stage")
	for _, status := range statusColumns {
		fmt.Fprintf(tw, "\t%s", status)
	}
	fmt.Fprint(tw, "\toldest pending\n")
	var stages []string
	counts := map[string]map[core.RowStatus]int64{}
	wait := map[string]time.Duration{}
	for _, d := range depth {
		if counts[d.Stage] == nil {
			counts[d.Stage] = map[core.RowStatus]int64{}
			stages = append(stages, d.Stage)
		}
		counts[d.Stage][d.Status] += d.Count
		if d.Status == core.StatusPending {
			wait[d.Stage] = d.OldestWait
		}
	}
	for _, st := range configured {
		if counts[st] == nil {
			counts[st] = map[core.RowStatus]int64{}
			stages = append(stages, st)
		}
	}
	slices.Sort(stages)
	totals := map[core.RowStatus]int64{}
	for _, st := range stages {
		fmt.Fprintf(tw, "%s\t", st)
		for _, status := range statusColumns {
			fmt.Fprintf(tw, "%d\t", counts[st][status])
			totals[status] += counts[st][status]
		}
		w := "-"
		if counts[st][core.StatusPending] > 0 {
			w = wait[st].Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\n", w)
	}
	fmt.Fprintf(tw, "total")
	for _, status := range statusColumns {
		fmt.Fprintf(tw, "\t%d", totals[status])
	}
	fmt.Fprintf(tw, "\n")
	tw.Flush()
}

// printKeys prints the ORDER KEYS line: the messages waiting, blocked, behind
// their order key's head, and what the heads do, counted in keys (a head
// holds all its key's blocked messages: counted in messages, the line's
// numbers would not add up to the messages it names first). A key behind a paused or
// retrying head waits until that head's time comes; one behind no head
// waits for a dispatcher to hand it on.
func printKeys(w io.Writer, k store.KeysWaiting) {
	if k.Keys == 0 {
		fmt.Fprintln(w, "\nORDER KEYS: no message waits behind its order key")
		return
	}
	fmt.Fprintf(w, "\nORDER KEYS: %s waiting behind the head of %s; keys by what their head does: %d paused, %d waiting for its retry, %d running, %d pending",
		messages(k.Messages), plural(k.Keys, "key"), k.HeadPaused, k.HeadRetrying, k.HeadRunning, k.HeadPending)
	if k.HeadNone > 0 {
		fmt.Fprintf(w, ", %d with no head: their older messages all finished (pepsi-dispatch hands them on)", k.HeadNone)
	}
	fmt.Fprintln(w)
}

// plural is "1 key" or "N keys".
func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// printStageStats prints the STAGES table: pepsi-dispatch's counts per stage,
// every configured stage included.
func printStageStats(w io.Writer, rows []queueadmin.StageStats, configured []string, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\nSTAGES (counted by pepsi-dispatch: pepsi.stage_stats)")
	for _, name := range configured {
		if !slices.ContainsFunc(rows, func(st queueadmin.StageStats) bool { return st.Stage == name }) {
			rows = append(rows, queueadmin.StageStats{StageDelta: core.StageDelta{Stage: name}})
		}
	}
	slices.SortFunc(rows, func(a, b queueadmin.StageStats) int { return strings.Compare(a.Stage, b.Stage) })
	if len(rows) == 0 {
		fmt.Fprintln(w, "  none yet (the dispatcher has not flushed any)")
	} else {
		fmt.Fprintf(tw, "stage\tpasses ok\tfailed by dispatcher\twatchdog timeouts\tworker crashes\tretries\trate-held\tmean pass\tupdated\n")
		for _, st := range rows {
			mean := "-"
			switch {
			case st.Processed > 0 && st.ProcessingUS == 0:
				mean = "<1µs" // times are reported in whole microseconds
			case st.Processed > 0:
				mean = time.Duration(st.ProcessingUS * int64(time.Microsecond) / st.Processed).String()
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", st.Stage, st.Processed, st.Failed, st.Timeouts, st.Crashes,
				st.Retries, (time.Duration(st.RateHeldUS) * time.Microsecond).Round(time.Millisecond), mean, ago(st.UpdatedAt, now))
		}
		tw.Flush()
		fmt.Fprintln(w, "  passes ok: passes answered 0, including those in which the stage failed the message itself (state.error)")
		fmt.Fprintln(w, "  failed by dispatcher: a non-zero answer, a worker crash or a protocol error (state.dispatch_error)")
		fmt.Fprintln(w, "  retries: messages paused for a retry (answer 75); rate-held: how long the stage had work its RATE held back")
	}
}

// printHealth prints the HEALTH table: what pepsi-dispatch recorded of each
// stage's workers (pepsi.stage_health), times by the server's clock.
func printHealth(w io.Writer, h queueadmin.Health) {
	switch {
	case len(h.Stages) == 0:
		fmt.Fprintln(w, "\nHEALTH: none recorded (no pepsi-dispatch has run on this schema)")
		return
	case h.Current:
		fmt.Fprintln(w, "\nHEALTH (recorded by pepsi-dispatch: pepsi.stage_health)")
	default:
		fmt.Fprintln(w, "\nHEALTH (as the last pepsi-dispatch left it: no dispatcher holds the lock, so nothing runs now)")
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "stage\tstate\tsince\treason\n")
	for _, st := range h.Stages {
		reason := st.Reason
		if st.State == core.HealthCannotStart && !st.Until.IsZero() {
			switch left := st.Until.Sub(h.Now); {
			case left >= time.Second:
				reason += fmt.Sprintf("; next try in %s", left.Round(time.Second))
			case left > 0:
				reason += "; next try in under a second"
			default:
				reason += "; next try when a message waits"
			}
		}
		if reason == "" {
			reason = "-"
		}
		reason = printable(reason)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", st.Stage, st.State, ago(st.Since, h.Now), reason)
	}
	tw.Flush()
}

// ago says how long before now t was, or "never" for the zero time.
func ago(t, now time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return now.Sub(t).Round(time.Second).String() + " ago"
}

func showCmd(a *app) *ffcli.Command {
	fs := newFlags("show")
	payloadOnly := fs.Bool("payload", false, "print only the payload, as raw bytes")
	return &ffcli.Command{
		Name:       "show",
		ShortUsage: "pepsi-queue [global flags] show [-payload] ID",
		ShortHelp:  "one message: stage, status, timeout, order key, state, payload size, times, timeline",
		LongHelp: `Prints one message: where it is (stage, status, paused timeout), its keys,
its state object (where stages keep their results and the dispatcher its
dispatch_error), the size of its payload and when it was created and last
changed, then its timeline (as history prints it): each pass with its stage,
the wait before it, how long it took, the worker and the outcome. A blocked message waits behind an older message of its order key:
show says which, and what that one is doing. With -payload, prints only the
payload bytes, for piping.

EXAMPLES
  pepsi-queue show 42
  pepsi-queue show -payload 42 | hexdump -C`,
		FlagSet: fs,
		Exec: func(ctx context.Context, args []string) error {
			id, err := messageID("show", fs, args)
			if err != nil {
				return err
			}
			return a.withConn(ctx, func(conn *pgx.Conn) error {
				m, err := queueadmin.Show(ctx, conn, id)
				if errors.Is(err, queueadmin.ErrNotFound) {
					return fmt.Errorf("message %d does not exist", id)
				}
				if err != nil {
					return err
				}
				if *payloadOnly {
					_, err := a.stdout.Write(m.Payload)
					return err
				}
				hist, err := queueadmin.History(ctx, conn, id)
				if err != nil {
					return err
				}
				printMessage(a.stdout, m, time.Now())
				if len(hist) > 0 {
					fmt.Fprintf(a.stdout, "history\n")
					printHistory(a.stdout, hist, m.CreatedAt)
				}
				return nil
			})
		},
	}
}

func printMessage(w io.Writer, m *queueadmin.Message, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "message\t%d\n", m.ID)
	fmt.Fprintf(tw, "stage\t%s\n", printable(m.Stage))
	fmt.Fprintf(tw, "status\t%s\n", m.Status)
	// A timeout means something only while the row is paused: a row that ran
	// since keeps the one of its last pause, which is no due time any more.
	if core.RowStatus(m.Status) == core.StatusPaused {
		switch {
		case m.Timeout != nil:
			fmt.Fprintf(tw, "timeout\t%s (%s)\n", m.Timeout.Format(time.RFC3339Nano), dueIn(*m.Timeout, now, time.Millisecond))
		case m.TimeoutText == "infinity":
			fmt.Fprintf(tw, "timeout\tinfinity (never due)\n")
		case m.TimeoutText == "-infinity":
			fmt.Fprintf(tw, "timeout\t-infinity (due)\n")
		}
	}
	fmt.Fprintf(tw, "attempts\t%d\n", m.Attempts)
	if m.DedupKey != "" {
		fmt.Fprintf(tw, "key\t%s\n", printableKey(m.DedupKey))
	}
	if m.TraceParent != "" {
		fmt.Fprintf(tw, "traceparent\t%s\n", m.TraceParent)
	}
	if m.OrderKey != "" {
		fmt.Fprintf(tw, "order key\t%s\n", printableKey(m.OrderKey))
	}
	printLineage(tw, m)
	if core.RowStatus(m.Status) == core.StatusBlocked {
		fmt.Fprintf(tw, "waits\t%s\n", waitsBehind(m.Head, now))
	}
	fmt.Fprintf(tw, "payload\t%d bytes\n", len(m.Payload))
	fmt.Fprintf(tw, "created\t%s\n", m.CreatedAt.Format(time.RFC3339Nano))
	fmt.Fprintf(tw, "updated\t%s (%s ago)\n", m.UpdatedAt.Format(time.RFC3339Nano), now.Sub(m.UpdatedAt).Round(time.Millisecond))
	tw.Flush()
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, m.State, "", "  "); err != nil {
		pretty.Reset()
		pretty.Write(m.State)
	}
	fmt.Fprintf(w, "state\n%s\n", pretty.String())
}

// dueIn says when t comes, seen at now: "due" if it has (to r), else "in D",
// D rounded to r, or "in about N years" past what a time.Duration holds
// (about 292 years), where t.Sub(now) would print its largest value.
func dueIn(t, now time.Time, r time.Duration) string {
	d := t.Sub(now)
	if d == time.Duration(math.MaxInt64) {
		return fmt.Sprintf("in about %d years", t.Year()-now.Year())
	}
	if d = d.Round(r); d <= 0 {
		return "due"
	}
	return "in " + d.String()
}

// waitsBehind says what a blocked message waits behind: its order key's
// head, and what that head is doing.
func waitsBehind(h *store.KeyHead, now time.Time) string {
	if h == nil {
		return "behind no unfinished message of its order key: pepsi-dispatch hands it the key next"
	}
	doing := fmt.Sprintf("%s at %s", h.Status, printable(h.Stage))
	if h.Status == core.StatusPaused {
		if h.Attempts > 0 {
			doing = fmt.Sprintf("paused at %s for retry %d", printable(h.Stage), h.Attempts)
		}
		if h.Timeout != nil {
			doing += fmt.Sprintf(" until %s, %s", h.Timeout.Format(time.RFC3339), dueIn(*h.Timeout, now, time.Second))
		}
	}
	return fmt.Sprintf("behind message %d of its order key (%s)", h.ID, doing)
}

func retryCmd(a *app) *ffcli.Command {
	fs := newFlags("retry")
	id := fs.Int64("id", 0, "retry only the message with this `ID`")
	stage := fs.String("stage", "", "retry only messages at this `STAGE`")
	status := fs.String("status", "", "retry only `failed` or only `timeout` messages (default: both)")
	to := fs.String("to", "", "send the messages to this `STAGE` instead of the one they are at")
	reason := fs.String("reason", "", "retry only messages whose dispatch_error contains this `TEXT` (ignoring case)")
	all := fs.Bool("all", false, "retry every failed and timed-out message (needed when no other filter is given)")
	dryRun := fs.Bool("n", false, "say how many messages would be retried, and change nothing")
	return &ffcli.Command{
		Name:       "retry",
		ShortUsage: "pepsi-queue [global flags] retry [-id ID] [-stage STAGE] [-status failed|timeout] [-reason TEXT] [-to STAGE] [-all] [-n]",
		ShortHelp:  "send failed or timed-out messages round again",
		LongHelp: `Makes failed and timed-out messages pending again, at the stage they are at (or
at -to), and wakes the dispatcher. Each retried message's state.dispatch_error
(the dispatcher's reason) moves into the array state.dispatch_error_history,
one entry per retry with the error, the status, the stage and the time; the
stage's own state (including a state.error a stage wrote) is left as it is.
Pending, running, paused and done messages are never touched. With no filter,
-all is required, so that a bare "retry" cannot resend everything by accident.
-reason selects by the dispatcher's reason (say, every message the remote
refused while it was down); -n says how many would be retried and changes
nothing. A retried message with an order key takes its place in its key's
order: the output says how many wait blocked behind another message of
their key (an older unfinished one, or a younger one a worker holds, which
finishes its pass first).

EXAMPLES
  pepsi-queue retry -id 42
  pepsi-queue retry -stage deliver -status timeout
  pepsi-queue retry -stage parse -to parse-v2
  pepsi-queue retry -reason 'connection refused' -n
  pepsi-queue retry -all`,
		FlagSet: fs,
		Exec: func(ctx context.Context, args []string) error {
			if err := noArgs("retry", args); err != nil {
				return err
			}
			f := queueadmin.RetryFilter{ID: *id, Stage: *stage, To: *to, Reason: *reason}
			switch *status {
			case "":
			case string(core.StatusFailed), string(core.StatusTimeout):
				f.Statuses = []core.RowStatus{core.RowStatus(*status)}
			default:
				return usagef("retry", "-status %q: want failed or timeout", *status)
			}
			if *id < 0 {
				return usagef("retry", "-id %d is not a message id", *id)
			}
			if err := emptyFilters(fs, "retry", "id", "stage", "status", "reason", "to"); err != nil {
				return err
			}
			if err := textFlags("retry", "-stage", *stage, "-reason", *reason, "-to", *to); err != nil {
				return err
			}
			if *id == 0 && *stage == "" && *status == "" && *reason == "" && !*all {
				return usagef("retry", "no filter given: use -id, -stage, -status or -reason, or -all to retry every failed and timed-out message")
			}
			if *to != "" {
				if err := a.checkStage("retry", "-to", *to); err != nil {
					return err
				}
			}
			return runRetry(ctx, a, f, *stage != "" || *reason != "" || *status != "", *dryRun)
		},
	}
}

// runRetry retries the messages f selects, or with dryRun counts them, and
// says what it did; others: a filter beside -id was given.
func runRetry(ctx context.Context, a *app, f queueadmin.RetryFilter, others, dryRun bool) error {
	return a.withConn(ctx, func(conn *pgx.Conn) error {
		var r store.Retried
		var err error
		if dryRun {
			r.Retried, err = queueadmin.RetryCount(ctx, conn, f)
		} else {
			r, err = queueadmin.RetryBlocked(ctx, conn, f)
		}
		if err != nil {
			return err
		}
		n := r.Retried
		if n == 0 && f.ID != 0 {
			return notSelected("retried", f.ID, "failed or timed out", others, dryRun)
		}
		if r.BlockedErr != nil {
			fmt.Fprintf(a.stderr, "pepsi-queue: warning: %v\n", r.BlockedErr)
		}
		switch {
		case dryRun:
			fmt.Fprintf(a.stdout, "would retry %s (nothing changed: -n)\n", messages(n))
		case r.BlockedErr != nil:
			fmt.Fprintf(a.stdout, "retried %s (how many wait blocked behind their order key is unknown)\n", messages(n))
		case r.Blocked > 0:
			fmt.Fprintf(a.stdout, "retried %s: %d pending again, %d blocked behind another message of their order key (an older unfinished one, or a younger one a worker holds until its pass ends)\n", messages(n), n-r.Blocked, r.Blocked)
		default:
			fmt.Fprintf(a.stdout, "retried %s: pending again\n", messages(n))
		}
		return nil
	})
}

func purgeCmd(a *app) *ffcli.Command {
	fs := newFlags("purge")
	olderThan := fs.String("older-than", "", "delete finished messages unchanged for this `AGE` (required): 24h, 90m, 7d")
	batch := fs.Int("batch", 1000, "rows deleted per transaction")
	status := fs.String("status", "", "delete only `done`, `failed` or `timeout` messages (comma-separated; default all three)")
	dryRun := fs.Bool("n", false, "say how many messages would be deleted, and delete nothing")
	return &ffcli.Command{
		Name:       "purge",
		ShortUsage: "pepsi-queue [global flags] purge -older-than AGE [-batch N] [-status done,failed,timeout] [-n]",
		ShortHelp:  "delete finished messages older than an age",
		LongHelp: `Deletes messages that left the pipeline (done, failed or timeout) and have not
changed for at least -older-than, in batches of -batch rows, each its own
transaction, so a large purge neither holds many locks nor one long
transaction. Pending, running and paused messages are never deleted. AGE is a
Go duration (90m, 36h) or a number of days (7d). -n says how many would be
deleted and deletes nothing.

EXAMPLES
  pepsi-queue purge -older-than 7d
  pepsi-queue purge -older-than 24h -status done -batch 5000`,
		FlagSet: fs,
		Exec: func(ctx context.Context, args []string) error {
			if err := noArgs("purge", args); err != nil {
				return err
			}
			if err := emptyFilters(fs, "purge", "status", "older-than"); err != nil {
				return err
			}
			if *olderThan == "" {
				return usagef("purge", "-older-than is required (for example -older-than 7d)")
			}
			age, err := parseAge(*olderThan)
			if err != nil {
				return usagef("purge", "-older-than: %v", err)
			}
			if *batch <= 0 || *batch > 1_000_000 {
				return usagef("purge", "-batch %d: want 1 to 1000000", *batch)
			}
			var statuses []core.RowStatus
			if *status != "" {
				for _, s := range strings.Split(*status, ",") {
					s := core.RowStatus(strings.TrimSpace(s))
					if !slices.Contains(queueadmin.Finished(), s) {
						return usagef("purge", "-status: %q is not done, failed or timeout", s)
					}
					statuses = append(statuses, s)
				}
			}
			return a.withConn(ctx, func(conn *pgx.Conn) error {
				if *dryRun {
					n, err := queueadmin.PurgeCount(ctx, conn, age, statuses)
					if err != nil {
						return err
					}
					fmt.Fprintf(a.stdout, "would purge %s unchanged for %s (nothing deleted: -n)\n", messages(n), *olderThan)
					return nil
				}
				n, err := queueadmin.Purge(ctx, conn, age, *batch, statuses, nil)
				if err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "purged %s unchanged for %s\n", messages(n), *olderThan)
				return nil
			})
		},
	}
}

// parseAge reads a Go duration or a whole number of days ("7d").
func parseAge(s string) (time.Duration, error) {
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil {
			return 0, fmt.Errorf("%q is not a number of days like 7d", s)
		}
		if n > 100*365 {
			return 0, fmt.Errorf("%q is more than 100 years", s)
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return 0, fmt.Errorf("%q is not an age like 24h, 90m or 7d", s)
		}
	}
	if d <= 0 {
		return 0, fmt.Errorf("%q must be positive", s)
	}
	return d, nil
}

func historyCmd(a *app) *ffcli.Command {
	fs := newFlags("history")
	asJSON := fs.Bool("json", false, "one JSON object per event, oldest first")
	return &ffcli.Command{
		Name:       "history",
		ShortUsage: "pepsi-queue [global flags] history [-json] ID",
		ShortHelp:  "what happened to one message: every pass and transition, oldest first",
		LongHelp: `Prints one message's history from pepsi.history, oldest first: each pass of
a stage with when its line was handed to the worker, the wait before it
(since the event before, or since the message was made), how long the pass
took (handed to answered), the worker's pid, the attempts and the outcome
(moved, done, paused, retry, failed, timeout, crashed, requeued, guard-miss,
answered), and the transitions without a pass (woken, reset, and retried by
an operator). Rows older than HISTORY_KEEP are gone; a stage with
HISTORY = off records no passes. With -json, one object per line: id,
stage, event, detail, handed_at, at, worker_pid, attempts.

EXAMPLES
  pepsi-queue history 42
  pepsi-queue history -json 42 | jq -r 'select(.event == "failed") | .detail'`,
		FlagSet: fs,
		Exec: func(ctx context.Context, args []string) error {
			id, err := messageID("history", fs, args)
			if err != nil {
				return err
			}
			return a.withConn(ctx, func(conn *pgx.Conn) error {
				hist, err := queueadmin.History(ctx, conn, id)
				if err != nil {
					return err
				}
				created := time.Time{}
				m, err := queueadmin.Show(ctx, conn, id)
				switch {
				case err == nil:
					created = m.CreatedAt
				case !errors.Is(err, queueadmin.ErrNotFound):
					return err
				}
				if len(hist) == 0 && m == nil {
					return fmt.Errorf("message %d does not exist and has no history", id)
				}
				if *asJSON {
					enc := json.NewEncoder(a.stdout)
					for _, h := range hist {
						if err := enc.Encode(h); err != nil {
							return err
						}
					}
					return nil
				}
				if len(hist) == 0 {
					fmt.Fprintf(a.stdout, "message %d has no history (kept HISTORY_KEEP; none for stages with HISTORY = off)\n", id)
					return nil
				}
				printHistory(a.stdout, hist, created)
				if m != nil && (m.ParentID != 0 || m.Children != 0) {
					tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
					printLineage(tw, m)
					return tw.Flush()
				}
				return nil
			})
		},
	}
}

// messageID reads the one message id of show or history (cmd, whose flags
// are fs) from args. A flag of cmd given after the id is not parsed (the
// flag package stops at the first argument that is not a flag): that is
// said, with where it goes, rather than that two arguments were given.
func messageID(cmd string, fs *flag.FlagSet, args []string) (int64, error) {
	if len(args) > 1 {
		for _, arg := range args[1:] {
			name, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
			if strings.HasPrefix(arg, "-") && fs.Lookup(name) != nil {
				return 0, usagef(cmd, "%s is given after the message id: put it before (pepsi-queue %s %s %s)", arg, cmd, arg, args[0])
			}
		}
	}
	if len(args) != 1 {
		return 0, usagef(cmd, "want exactly one message id, got %d arguments", len(args))
	}
	id, err := strconv.ParseInt(args[0], 10, 64)
	if err != nil || id <= 0 {
		return 0, usagef(cmd, "%q is not a message id (a positive whole number)", args[0])
	}
	return id, nil
}

// printLineage names the message whose pass emitted m (docs/protocol.md,
// "Emitting messages") and counts the messages m's passes emitted, if any:
// each is a message of its own, with its own history.
func printLineage(tw io.Writer, m *queueadmin.Message) {
	if m.ParentID != 0 {
		fmt.Fprintf(tw, "parent\t%d (emitted by its pass; pepsi-queue history %d)\n", m.ParentID, m.ParentID)
	}
	if m.Children != 0 {
		fmt.Fprintf(tw, "children\t%d (messages its passes emitted)\n", m.Children)
	}
}

// printHistory prints a message's history as a timeline: each event's time,
// stage, the wait before a pass (since the event before it, or since created
// for the first), how long the pass took, the worker, attempts and outcome.
func printHistory(w io.Writer, hist []queueadmin.HistoryRow, created time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "AT\tSTAGE\tWAITED\tTOOK\tWORKER\tATTEMPTS\tEVENT\n")
	prev := created
	for _, h := range hist {
		waited, took, worker := "-", "-", "-"
		if h.HandedAt != nil {
			// (A wait below zero is two clocks apart: the dispatcher's
			// stamps a pass, the database's the message's creation.)
			if !prev.IsZero() && !h.HandedAt.Before(prev) {
				waited = h.HandedAt.Sub(prev).Round(time.Microsecond).String()
			}
			took = h.At.Sub(*h.HandedAt).Round(time.Microsecond).String()
		}
		if h.WorkerPID != 0 {
			worker = fmt.Sprintf("pid %d", h.WorkerPID)
		}
		event := h.Event
		if h.Detail != "" {
			event += ": " + printable(h.Detail)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", h.At.Format(time.RFC3339Nano), printable(h.Stage), waited, took, worker, h.Attempts, event)
		prev = h.At
	}
	tw.Flush()
}
