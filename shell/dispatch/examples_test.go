package dispatch_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Proves: the example stages of examples/stages, a Python stage with only the
// standard library and a POSIX sh stage, both INPUT = message, carry messages
// through a pipeline on the real dispatcher: every message ends done with the
// Python stage's word count and the sh stage's mark in its state, and neither
// stage had a database. python3 must be installed (make test installs it on
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
