package dispatch_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// filterScript is a POSIX sh filter stage for these tests: it records its
// arguments in the file "args" beside it, refuses to run (exit 4 before it
// answers anything) if its environment holds any way to reach a database,
// records every line it reads in the file "lines" beside it, and answers each
// message with a transition to done and a patch.
const filterScript = `#!/bin/sh
printf '%s\n' "$*" >> "$(dirname "$0")/args"
if env | grep -E '^(PG[A-Z_]*|PEPSI_DATABASE|DATABASE_URL)=' >&2 || [ "$PEPSI_INPUT" != message ]; then
	echo "filter: a database is in my environment" >&2
	exit 4
fi
while IFS= read -r line; do
	printf '%s\n' "$line" >> "$(dirname "$0")/lines"
	echo '0 >done {"filtered":true}'
done
`

// writeFilter writes filterScript as an executable "filter" in e's directory.
func (e *env) writeFilter() {
	e.t.Helper()
	if err := os.WriteFile(filepath.Join(e.dir, "filter"), []byte(filterScript), 0o755); err != nil {
		e.t.Fatal(err)
	}
}

// Proves: a stage with INPUT = message is handed each message itself, one JSON
// line per message, is started as "PROGRAM worker -c CONFIG_FILE" like any
// stage (docs/protocol.md, "Starting"), and runs with no database in its
// environment (no PG*, PEPSI_DATABASE or DATABASE_URL, though the dispatcher's
// environment has them all): the filter refuses to run otherwise, and here
// every message ends done with the filter's patch.
func TestAMessageStageIsHandedTheMessageAndNoDatabase(t *testing.T) {
	t.Parallel()
	e := newEnv(t, `
[stage-f]
PROGRAM = @DIR@/filter
INPUT = message
PARALLELISM = 1
QUEUE_LIMIT = 4
`)
	e.writeFilter()
	e.workerEnv = append(os.Environ(), "PGHOST=127.0.0.1", "PGPORT=5432", "PGUSER=postgres", "PGPASSWORD=secret",
		"PEPSI_DATABASE="+e.url, "DATABASE_URL="+e.url)
	_, err := e.db.Exec(context.Background(), `
		INSERT INTO pepsi.queue (stage, state, payload) VALUES
			('f', '{"k": [1, 2], "s": "x"}', convert_to('héllo', 'UTF8')),
			('f', '{}', '\xff00'::bytea),
			('f', '{}', NULL)`)
	if err != nil {
		t.Fatal(err)
	}
	d := e.start()
	e.waitCounts(10*time.Second, map[string]int{"done": 3})
	d.stopClean()
	got, err := os.ReadFile(filepath.Join(e.dir, "lines"))
	if err != nil {
		t.Fatal(err)
	}
	// Each line carries its pass's traceparent: the first pass of a message
	// that had none is the root of the trace the claim gave it, the row's.
	traces := regexp.MustCompile(`,"traceparent":"([0-9a-f-]{55})"`)
	for i, m := range traces.FindAllStringSubmatch(string(got), -1) {
		var row string
		if err := e.db.QueryRow(context.Background(), `SELECT traceparent FROM pepsi.queue WHERE ingress_id = $1`, i+1).Scan(&row); err != nil || row != m[1] {
			t.Errorf("line %d carries traceparent %s; the row's is %q (%v), want the same", i+1, m[1], row, err)
		}
	}
	want := `{"id":1,"stage":"f","attempts":0,"state":{"k":[1,2],"s":"x"},"payload":"héllo"}
{"id":2,"stage":"f","attempts":0,"state":{},"payload_base64":"/wA="}
{"id":3,"stage":"f","attempts":0,"state":{}}
`
	if n := len(traces.FindAllString(string(got), -1)); n != 3 {
		t.Errorf("%d lines carry a traceparent, want 3", n)
	}
	if stripped := traces.ReplaceAllString(string(got), ""); stripped != want {
		t.Errorf("the filter read\n%s\nwant, but for the traceparents,\n%s", got, want)
	}
	if n := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE state @> '{"filtered": true}'`); n != 3 {
		t.Errorf("%d rows carry the filter's patch; want 3", n)
	}
	if logs := d.logs.String(); strings.Contains(logs, "a database is in my environment") {
		t.Errorf("the filter saw a database:\n%s", logs)
	}
	args, err := os.ReadFile(filepath.Join(e.dir, "args"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSuffix(string(args), "\n"), "\n") {
		if want := "worker -c " + e.conf; line != want {
			t.Errorf("the filter was started with arguments %q; want %q", line, want)
		}
	}
}

// Proves: a stage built with the stage library runs in message mode under the
// real dispatcher (PEPSI_INPUT=message, -c FILE, no database in its
// environment): messages pass
// through it and an id stage after it, its answered patches (the pass counts
// n_STAGE) land in the rows, and "answer" failures fail only their message.
func TestALibraryStageRunsAsAFilter(t *testing.T) {
	t.Parallel()
	e := newEnv(t, `
[stage-f]
PROGRAM = @BIN@/libstage
INPUT = message
PARALLELISM = 2
QUEUE_LIMIT = 8

[stage-g]
PROGRAM = @BIN@/teststage
PARALLELISM = 1
QUEUE_LIMIT = 8
`)
	e.workerEnv = append(os.Environ(), "PEPSI_DATABASE="+e.url)
	e.insertN("f", "f=advance:g;g=done", 200)
	bad := e.insert("f", "f=answer:7 refused")
	d := e.start()
	e.waitCounts(20*time.Second, map[string]int{"done": 200, "failed": 1})
	d.stopClean()
	e.expectRow(bad[0], "failed", "f", "refused")
	if n := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE status = 'done' AND (state ->> 'n_f')::int = 1`); n != 200 {
		t.Errorf("%d done rows carry n_f = 1 from the filter's patch; want 200", n)
	}
}
