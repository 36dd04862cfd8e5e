package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/queueadmin"
)

// selectFlags are the filters list and discard share: which messages a
// command is about.
type selectFlags struct {
	fs        *flag.FlagSet
	id        *int64
	stage     *string
	status    *string
	reason    *string
	olderThan *string
	orderKey  *string
}

// addSelectFlags defines the filters on fs; verb says what the command does
// to the messages it selects ("list", "discard").
func addSelectFlags(fs *flag.FlagSet, verb string) *selectFlags {
	return &selectFlags{
		fs:        fs,
		id:        fs.Int64("id", 0, verb+" only the message with this `ID`"),
		stage:     fs.String("stage", "", verb+" only messages at this `STAGE`"),
		status:    fs.String("status", "", verb+" only messages with one of these `STATUSES` (comma-separated)"),
		reason:    fs.String("reason", "", verb+" only messages whose dispatch_error contains this `TEXT` (ignoring case)"),
		olderThan: fs.String("older-than", "", verb+" only messages unchanged for this `AGE`: 24h, 90m, 7d"),
		orderKey:  fs.String("order-key", "", verb+" only the messages of this order `KEY`"),
	}
}

// selection reads the filters, with allowed the statuses -status may name, and
// checks -stage against the configuration when one is loaded.
func (f *selectFlags) selection(a *app, cmd string, allowed []core.RowStatus) (queueadmin.Selection, error) {
	sel := queueadmin.Selection{ID: *f.id, Stage: *f.stage, Reason: *f.reason, OrderKey: *f.orderKey}
	if *f.id < 0 {
		return sel, usagef(cmd, "-id %d is not a message id", *f.id)
	}
	if err := emptyFilters(f.fs, cmd, "id", "stage", "status", "reason", "older-than", "order-key"); err != nil {
		return sel, err
	}
	if err := textFlags(cmd, "-stage", *f.stage, "-reason", *f.reason, "-order-key", *f.orderKey); err != nil {
		return sel, err
	}
	if *f.status != "" {
		for _, s := range strings.Split(*f.status, ",") {
			st := core.RowStatus(strings.TrimSpace(s))
			if !slices.Contains(allowed, st) {
				return sel, usagef(cmd, "-status: %q is not one of %s", st, joinStatuses(allowed))
			}
			sel.Statuses = append(sel.Statuses, st)
		}
	}
	if *f.olderThan != "" {
		age, err := parseAge(*f.olderThan)
		if err != nil {
			return sel, usagef(cmd, "-older-than: %v", err)
		}
		sel.OlderThan = age
	}
	// A stage the configuration does not have is no error here: its
	// messages (a typo's, a stage since removed) are what an operator must
	// find and end.
	return sel, nil
}

// textFlags checks that each value of pairs (a flag's name, then its value)
// is UTF-8, as the database's text is: a value that is not would reach the
// server and come back as its encoding error, naming no flag.
func textFlags(cmd string, pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if !utf8.ValidString(pairs[i+1]) {
			return usagef(cmd, "%s %q is not valid UTF-8", pairs[i], pairs[i+1])
		}
	}
	return nil
}

// emptyFilters refuses a flag of names given an empty value, or -id given
// 0: "-stage $S" with S unset would otherwise select as if no -stage were
// given, and widen a retry or a discard to every stage's messages (a purge
// to every finished status, an enqueue's -not-before to now).
func emptyFilters(fs *flag.FlagSet, cmd string, names ...string) error {
	var err error
	fs.Visit(func(f *flag.Flag) {
		if err != nil || !slices.Contains(names, f.Name) {
			return
		}
		switch v := f.Value.String(); {
		case f.Name == "id" && v == "0":
			err = usagef(cmd, "-id 0 is not a message id")
		case v == "":
			err = usagef(cmd, "-%s is given an empty value (an unset variable?): give one, or leave -%s out", f.Name, f.Name)
		}
	})
	return err
}

// notSelected is the error of a command given -id whose message the
// selection does not hold: what it wanted of the message (wanted), and, when
// other filters were given, that they may be why.
func notSelected(verb string, id int64, wanted string, others, dryRun bool) error {
	would := "was not " + verb
	if dryRun {
		would = "would not be " + verb
	}
	why := "it does not exist, or is not " + wanted
	if others {
		why += ", or does not match the other filters"
	}
	return fmt.Errorf("message %d %s: %s (see pepsi-queue show %d)", id, would, why, id)
}

// any says whether a filter other than the statuses is given.
func (f *selectFlags) any() bool {
	return *f.id != 0 || *f.stage != "" || *f.reason != "" || *f.olderThan != "" || *f.orderKey != ""
}

func joinStatuses(list []core.RowStatus) string {
	var s []string
	for _, x := range list {
		s = append(s, string(x))
	}
	return strings.Join(s, ", ")
}

func listCmd(a *app) *ffcli.Command {
	fs := newFlags("list")
	sf := addSelectFlags(fs, "list")
	limit := fs.Int("limit", 100, "list at most `N` messages (0: all)")
	asJSON := fs.Bool("json", false, "one JSON object per line: id, stage, status, dispatch_error, attempts, key, order_key, created_at, updated_at")
	count := fs.Bool("count", false, "print only how many messages the filters select")
	return &ffcli.Command{
		Name:       "list",
		ShortUsage: "pepsi-queue [global flags] list [-stage STAGE] [-status S,...] [-reason TEXT] [-older-than AGE] [-order-key KEY] [-id ID] [-limit N] [-json | -count]",
		ShortHelp:  "list messages by stage, status, reason and age",
		LongHelp: `Lists the messages the filters select, oldest first (by id): id, stage,
status, attempts, age since the last change and state.dispatch_error (the
dispatcher's reason, for a failed, timed-out or retrying message). Filters
combine; none lists every message. -json prints one JSON object per line
for scripts; -count prints only how many messages are selected. Reading
only: nothing is changed.

EXAMPLES
  pepsi-queue list -status failed                    failed messages
  pepsi-queue list -status failed -reason 'connection refused' -count
  pepsi-queue list -stage deliver -status paused -older-than 1h
  pepsi-queue list -order-key acct-9                 one order key's messages, oldest first
  pepsi-queue list -status failed,timeout -limit 0 -json | jq .dispatch_error`,
		FlagSet: fs,
		Exec: func(ctx context.Context, args []string) error {
			if err := noArgs("list", args); err != nil {
				return err
			}
			sel, err := sf.selection(a, "list", core.RowStatuses())
			if err != nil {
				return err
			}
			if *limit < 0 {
				return usagef("list", "-limit %d: want 0 (all) or more", *limit)
			}
			if *asJSON && *count {
				return usagef("list", "-json and -count exclude each other")
			}
			return a.withConn(ctx, func(conn *pgx.Conn) error {
				if *count {
					n, err := queueadmin.Count(ctx, conn, sel)
					if err == nil {
						fmt.Fprintln(a.stdout, n)
					}
					return err
				}
				return printList(ctx, conn, a.stdout, sel, *limit, *asJSON, time.Now())
			})
		},
	}
}

// listedJSON is one line of list -json.
type listedJSON struct {
	ID            int64     `json:"id"`
	Stage         string    `json:"stage"`
	Status        string    `json:"status"`
	DispatchError string    `json:"dispatch_error"`
	Attempts      int       `json:"attempts"`
	Key           string    `json:"key,omitempty"`
	OrderKey      string    `json:"order_key,omitempty"`
	CreatedAt     time.Time `json:"created_at"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// printList writes the selected messages to w, as a table or as JSON lines.
// Both stream: the table is written tableBatch rows at a time (see table),
// so a listing of every message holds one batch, not all of them, and its
// first rows are out while the rest are read.
func printList(ctx context.Context, conn *pgx.Conn, w io.Writer, sel queueadmin.Selection, limit int, asJSON bool, now time.Time) error {
	if asJSON {
		enc := json.NewEncoder(w)
		return queueadmin.List(ctx, conn, sel, limit, func(m queueadmin.Listed) error {
			return enc.Encode(listedJSON{ID: m.ID, Stage: m.Stage, Status: string(m.Status), DispatchError: m.DispatchError,
				Attempts: m.Attempts, Key: m.DedupKey, OrderKey: m.OrderKey, CreatedAt: m.CreatedAt, UpdatedAt: m.UpdatedAt})
		})
	}
	tw := &table{w: w, rows: [][]string{{"id", "stage", "status", "attempts", "unchanged for", "dispatch_error"}}}
	// One message past the limit is read, not listed: whether there is one
	// is whether the listing was cut, which a selection of exactly -limit
	// messages is not.
	n, read, more := 0, limit, false
	if limit > 0 {
		read = limit + 1
	}
	err := queueadmin.List(ctx, conn, sel, read, func(m queueadmin.Listed) error {
		if limit > 0 && n == limit {
			more = true
			return nil
		}
		n++
		return tw.row(strconv.FormatInt(m.ID, 10), printable(m.Stage), string(m.Status), strconv.Itoa(m.Attempts),
			now.Sub(m.UpdatedAt).Round(time.Second).String(), oneLine(m.DispatchError))
	})
	if err != nil {
		return err
	}
	if err := tw.flush(); err != nil {
		return err
	}
	if more {
		fmt.Fprintf(w, "(the first %d; -limit 0 lists them all, -count counts them)\n", limit)
	}
	return nil
}

// tableBatch is how many rows a table holds before it writes them: as many
// as a page of the listing (queueadmin reads 1,000 at a time).
const tableBatch = 1000

// table writes rows of cells in columns, the last cell of a row unpadded,
// two spaces between columns, as text/tabwriter did (padding 2): the same
// table for a listing of one batch. It writes every tableBatch rows, where
// tabwriter held the whole listing until its Flush: a listing of 1.75
// million messages grew to 889 MB and printed nothing until its end. A
// column is as wide as its widest cell so far: it widens at a batch with a
// wider cell (ids of one more digit, a longer stage) and never narrows.
type table struct {
	w      io.Writer
	widths []int
	rows   [][]string
}

// row adds one row, and writes the batch once it is full.
func (t *table) row(cells ...string) error {
	t.rows = append(t.rows, cells)
	if len(t.rows) < tableBatch {
		return nil
	}
	return t.flush()
}

// flush writes the rows held, in one Write.
func (t *table) flush() error {
	for _, r := range t.rows {
		for i, c := range r[:len(r)-1] {
			if i == len(t.widths) {
				t.widths = append(t.widths, 0)
			}
			t.widths[i] = max(t.widths[i], utf8.RuneCountInString(c))
		}
	}
	var b strings.Builder
	for _, r := range t.rows {
		for i, c := range r[:len(r)-1] {
			b.WriteString(c)
			b.WriteString(strings.Repeat(" ", t.widths[i]-utf8.RuneCountInString(c)+2))
		}
		b.WriteString(r[len(r)-1])
		b.WriteByte('\n')
	}
	t.rows = t.rows[:0]
	if _, err := io.WriteString(t.w, b.String()); err != nil {
		return fmt.Errorf("write the listing: %w", err)
	}
	return nil
}

// oneLine keeps a reason on its table row: line breaks become spaces, other
// control characters are escaped (printable) and a long reason is cut.
func oneLine(s string) string {
	s = printable(strings.Join(strings.Fields(s), " "))
	if r := []rune(s); len(r) > 120 {
		s = string(r[:119]) + "…"
	}
	return s
}

// reasonIsAFilter is said when discard's -reason selected nothing: it
// selects by the reason a message already has, and -note is the operator's.
const reasonIsAFilter = "-reason selects messages by the dispatch_error they already have; to record your own reason, use -note"

func discardCmd(a *app) *ffcli.Command {
	fs := newFlags("discard")
	sf := addSelectFlags(fs, "discard")
	note := fs.String("note", "", "add this `TEXT` to the dispatch_error the discarded messages get")
	all := fs.Bool("all", false, "discard every pending and paused message (needed when no other filter is given)")
	dryRun := fs.Bool("n", false, "say how many messages would be discarded, and change nothing")
	return &ffcli.Command{
		Name:       "discard",
		ShortUsage: "pepsi-queue [global flags] discard [-id ID] [-stage STAGE] [-status pending|paused|blocked] [-reason TEXT] [-older-than AGE] [-order-key KEY] [-note TEXT] [-all] [-n]",
		ShortHelp:  "end pending, paused or blocked messages as failed, by hand",
		LongHelp: `Ends the selected pending, paused or blocked messages (waiting for a stage,
for their retry or pause to end, or behind an older message of their order
key) as failed, their state.dispatch_error saying
that an operator discarded them (with -note added). They are then finished
like any failed message: pepsi-queue retry sends them round again, purge
deletes them. A message a worker holds (running) is never touched, and one
the dispatcher claims at the same moment either is discarded first (the
claim then skips it) or claimed first (the discard skips it). -reason selects
by the dispatch_error a message already has (a retrying message keeps the
reason of its last temporary failure there). With no filter, -all is
required. -n says how many would be discarded and changes nothing.

EXAMPLES
  pepsi-queue discard -id 42
  pepsi-queue discard -stage deliver -status paused -reason 'mailbox full' -n
  pepsi-queue discard -stage import -older-than 2d -note 'stale import, ticket 881'
  pepsi-queue discard -order-key acct-9 -status blocked -note 'account closed'`,
		FlagSet: fs,
		Exec: func(ctx context.Context, args []string) error {
			if err := noArgs("discard", args); err != nil {
				return err
			}
			sel, err := sf.selection(a, "discard", queueadmin.Discardable())
			if err != nil {
				return err
			}
			if err := textFlags("discard", "-note", *note); err != nil {
				return err
			}
			if !sf.any() && *sf.status == "" && !*all {
				return usagef("discard", "no filter given: use -id, -stage, -status, -reason, -older-than or -order-key, or -all to discard every pending, paused and blocked message")
			}
			return a.withConn(ctx, func(conn *pgx.Conn) error {
				n, err := queueadmin.Discard(ctx, conn, sel, *note, *dryRun)
				if err != nil {
					return err
				}
				if n == 0 && *sf.id != 0 {
					others := *sf.stage != "" || *sf.reason != "" || *sf.olderThan != "" || *sf.orderKey != "" || *sf.status != ""
					err := notSelected("discarded", *sf.id, "pending, paused or blocked", others, *dryRun)
					if *sf.reason != "" {
						err = fmt.Errorf("%w; %s", err, reasonIsAFilter)
					}
					return err
				}
				if n == 0 && *sf.reason != "" {
					// A script may mean its -reason as the text to write:
					// say so rather than let it pass for a discard.
					fmt.Fprintf(a.stderr, "pepsi-queue discard: nothing selected; %s\n", reasonIsAFilter)
				}
				if *dryRun {
					fmt.Fprintf(a.stdout, "would discard %s (nothing changed: -n)\n", messages(n))
					return nil
				}
				fmt.Fprintf(a.stdout, "discarded %s: failed now\n", messages(n))
				return nil
			})
		},
	}
}
