package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/queueadmin"
)

// The table of list streams, as its pages of 1,000 (the manual's "read
// 1,000 at a time") meant it to: it is written while the listing is read,
// where it was held whole until the end (889 MB for 1.75 million messages,
// and nothing on the screen). The writer
// here deletes the queue's rows after the 1,500th when it is first written
// to: a table that streams has by then read one page of 1,000 and lists
// fewer than the 3,000 there were; one held to the end read them all first.
func TestTheListsTableIsWrittenWhileItIsRead(t *testing.T) {
	t.Parallel()
	const rows, kept = 3000, 1500
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
	ctx := t.Context()
	if _, err := conn.Exec(ctx, fmt.Sprintf(`INSERT INTO pepsi.queue (stage, status, state)
		SELECT 'a', 'failed', '{"dispatch_error": "exit 1"}' FROM generate_series(1, %d)`, rows)); err != nil {
		t.Fatal(err)
	}
	w := &deletingWriter{t: t, conn: pgtest.Connect(t, url), after: kept}
	if err := printList(ctx, conn, w, queueadmin.Selection{}, 0, false, time.Now()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(w.out.String(), "\n"), "\n")
	if listed := len(lines) - 1; listed < tableBatch || listed >= rows {
		t.Fatalf("list -limit 0 of %d messages, the rows after %d deleted at its first write, listed %d; want fewer than %d (written while read) and at least a batch of %d",
			rows, kept, listed, rows, tableBatch)
	}
	for i, line := range lines[1:] {
		if id := strings.Fields(line)[0]; id != fmt.Sprint(i+1) {
			t.Fatalf("row %d of the listing is %q; want id %d", i+1, line, i+1)
		}
	}
}

// deletingWriter keeps what is written to it, and at the first write
// deletes the queue's rows after after, on a connection of its own.
type deletingWriter struct {
	t       *testing.T
	conn    *pgx.Conn
	after   int
	deleted bool
	out     strings.Builder
}

func (w *deletingWriter) Write(p []byte) (int, error) {
	if !w.deleted {
		w.deleted = true
		if _, err := w.conn.Exec(context.Background(), "DELETE FROM pepsi.queue WHERE ingress_id > $1", w.after); err != nil {
			w.t.Errorf("delete the rows after %d: %v", w.after, err)
		}
	}
	return w.out.Write(p)
}

// A table of one batch is the table text/tabwriter made of the same cells
// (the listing's table until it streamed): columns as wide as their widest
// cell and two spaces, the last cell unpadded. Over several batches a
// column widens at the batch with a wider cell and never narrows.
func TestATableIsTabwritersTableAndItsColumnsNeverNarrow(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		var cells [][]string
		for range 1 + r.IntN(20) {
			row := make([]string, 4)
			for i := range row {
				row[i] = strings.Repeat("é", r.IntN(12))
			}
			cells = append(cells, row)
		}
		var got, want strings.Builder
		tb := &table{w: &got}
		tw := tabwriter.NewWriter(&want, 0, 4, 2, ' ', 0)
		for _, row := range cells {
			if err := tb.row(row...); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintln(tw, strings.Join(row, "\t"))
		}
		if err := tb.flush(); err != nil {
			t.Fatal(err)
		}
		if err := tw.Flush(); err != nil {
			t.Fatal(err)
		}
		if got.String() != want.String() {
			t.Fatalf("table of %q:\n%s\ntabwriter's:\n%s", cells, got.String(), want.String())
		}
	}
	var out strings.Builder
	tb := &table{w: &out}
	ids := func(n int, id string) {
		for range n {
			if err := tb.row(id, "a", "x"); err != nil {
				t.Fatal(err)
			}
		}
	}
	ids(tableBatch, "1000000")
	ids(tableBatch, "7") // narrower, the next batch
	ids(1, "123456789")  // wider, the last
	if err := tb.flush(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out.String(), "\n")
	for i, want := range map[int]string{0: "1000000  a  x", tableBatch: "7        a  x", 2 * tableBatch: "123456789  a  x"} {
		if lines[i] != want {
			t.Errorf("line %d: %q; want %q", i+1, lines[i], want)
		}
	}
}
