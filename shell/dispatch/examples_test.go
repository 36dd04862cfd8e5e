package dispatch_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Proves: the example stages words.py and finish.sh of examples/stages, a
// Python stage with only the standard library and a POSIX sh stage, both
// INPUT = message, carry messages through a pipeline on the real
// dispatcher: every message ends done with the Python stage's word count and
// the sh stage's mark in its state, and neither stage had a database. python3 must be installed (make test installs it on
// Debian: .ci/python-up); the test fails, never skips, without it.
func TestTheExampleStagesInPythonAndShRunAPipeline(t *testing.T) {
	t.Parallel()
	dir, err := filepath.Abs("../../examples/stages")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, `
[stage-words]
PROGRAM = `+filepath.Join(dir, "words.py")+`
INPUT = message
PARALLELISM = 2
QUEUE_LIMIT = 16

[stage-finish]
PROGRAM = `+filepath.Join(dir, "finish.sh")+`
INPUT = message
PARALLELISM = 1
QUEUE_LIMIT = 16
`)
	_, err = e.db.Exec(context.Background(), `
		INSERT INTO pepsi.queue (stage, payload)
		SELECT 'words', convert_to(repeat('word ', i % 7), 'UTF8') FROM generate_series(1, 300) i`)
	if err != nil {
		t.Fatal(err)
	}
	e.workerEnv = append(os.Environ(), "PEPSI_DATABASE="+e.url)
	d := e.start()
	e.waitCounts(60*time.Second, map[string]int{"done": 300})
	d.stopClean()
	wrong := e.scalar(`SELECT count(*) FROM pepsi.queue
		WHERE (state ->> 'words')::int IS DISTINCT FROM ingress_id % 7
		   OR (state ->> 'finished')::bigint IS DISTINCT FROM ingress_id`)
	if wrong != 0 {
		t.Errorf("%d of 300 rows lack the right word count or finish mark in their state", wrong)
	}
}

// Proves: the example stages that emit (examples/stages/split_csv.py, which
// splits a CSV payload into one message per row, and fanout.sh, which fans
// each message out to two recipients) work on the real dispatcher: every
// parent ends done with exactly its children, each child reaches its stage
// (finished there by finish.sh) with parent_id naming its parent and the
// fields its parent's stage gave it; a payload that is not CSV fails its
// message with the stage's reason and leaves no child. python3 must be
// installed, as above.
func TestTheExampleStagesThatEmitSplitAndFanOut(t *testing.T) {
	t.Parallel()
	dir, err := filepath.Abs("../../examples/stages")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, `
[stage-split]
PROGRAM = `+filepath.Join(dir, "split_csv.py")+`
INPUT = message
PARALLELISM = 2
[stage-row]
PROGRAM = `+filepath.Join(dir, "finish.sh")+`
INPUT = message
[stage-fanout]
PROGRAM = `+filepath.Join(dir, "fanout.sh")+`
INPUT = message
[stage-deliver]
PROGRAM = `+filepath.Join(dir, "finish.sh")+`
INPUT = message
`)
	// Message i of split has i % 5 rows "k,wK" under the header "k,word".
	const splits, fanouts = 60, 40
	_, err = e.db.Exec(context.Background(), `
		INSERT INTO pepsi.queue (stage, payload)
		SELECT 'split', convert_to(E'k,word\n' || coalesce((SELECT string_agg(k || ',w' || k || E'\n', '' ORDER BY k)
		                                                    FROM generate_series(1, i % 5) k), ''), 'UTF8')
		FROM generate_series(1, $1) i`, splits)
	if err != nil {
		t.Fatal(err)
	}
	e.insertN("fanout", "", fanouts)
	bad := e.insert("split", "a,b\n1\n")
	rows := 0
	for i := 1; i <= splits; i++ {
		rows += i % 5
	}
	d := e.start()
	e.waitCounts(60*time.Second, map[string]int{"done": splits + rows + 3*fanouts, "failed": 1})
	d.stopClean()

	if k := e.scalar(`SELECT count(*) FROM pepsi.queue p WHERE p.stage = 'split' AND p.status = 'done'
		AND ((p.state ->> 'rows')::int IS DISTINCT FROM array_length(string_to_array(convert_from(p.payload, 'UTF8'), E'\n'), 1) - 2
		  OR (p.state ->> 'rows')::int <> (SELECT count(*) FROM pepsi.queue c WHERE c.parent_id = p.ingress_id))`); k != 0 {
		t.Errorf("%d split messages do not have one child per CSV row", k)
	}
	if k := e.scalar(`SELECT count(*) FROM pepsi.queue c JOIN pepsi.queue p ON p.ingress_id = c.parent_id
		WHERE c.stage = 'row' AND c.status = 'done' AND p.stage = 'split'
		  AND convert_from(c.payload, 'UTF8') = (c.state -> 'fields' ->> 'k') || ',' || (c.state -> 'fields' ->> 'word')
		  AND (c.state ->> 'finished')::bigint = c.ingress_id`); k != int64(rows) {
		t.Errorf("%d rows are done at stage row with their parent and fields, want %d", k, rows)
	}
	if k := e.scalar(`SELECT count(*) FROM pepsi.queue p WHERE p.stage = 'fanout' AND p.status = 'done'
		AND (SELECT count(*) FROM pepsi.queue c WHERE c.parent_id = p.ingress_id AND c.stage = 'deliver' AND c.status = 'done'
		     AND (c.state ->> 'from')::bigint = p.ingress_id AND convert_from(c.payload, 'UTF8') LIKE 'to: %@example.org') = 2`); k != fanouts {
		t.Errorf("%d fanout messages have their two deliveries done, want %d", k, fanouts)
	}
	e.expectRow(bad[0], "failed", "split", "not CSV with a header: line 2 has 1 fields, the header 2")
	if k := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE parent_id = $1`, bad[0]); k != 0 {
		t.Errorf("the message that is not CSV left %d children", k)
	}
}

// Proves: split_csv.py gives each child its row as CSV that reads back as
// that one row, even when a field holds a line break (quoted, as the
// payload's own CSV had it): written bare, "1,x\ny" would read back as two
// records.
func TestTheCSVSplitterQuotesAFieldWithALineBreak(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("../../examples/stages/split_csv.py")
	cmd.Stdin = strings.NewReader(`{"id":1,"stage":"split","attempts":0,"state":{},"payload":"k,word\n1,\"x\ny\"\n2,\"a\rb\"\n"}` + "\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("split_csv.py: %v\n%s", err, out)
	}
	var payloads []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if !strings.HasPrefix(l, "+") {
			continue
		}
		var emit struct{ Payload string }
		if err := json.Unmarshal([]byte(l[1:]), &emit); err != nil {
			t.Fatalf("emit line %q: %v", l, err)
		}
		payloads = append(payloads, emit.Payload)
	}
	want := []string{"1,\"x\ny\"", "2,\"a\rb\""}
	if !slices.Equal(payloads, want) {
		t.Errorf("children's payloads %q; want %q\n%s", payloads, want, out)
	}
}
