package dispatch_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// abuseFilter is an INPUT = message stage in sh whose misbehaviour each
// message's payload chooses: answer twice, write a partial line and hang, or
// exit in the middle of its pipeline; with a file "eager" beside it, its first
// worker answers before it has read anything. Any other message is finished.
const abuseFilter = `#!/bin/sh
dir=$(dirname "$0")
if [ -e "$dir/eager" ] && [ ! -e "$dir/eager-done" ]; then
	: > "$dir/eager-done"
	echo '0 >done'
fi
while IFS= read -r line; do
	case $line in
	*'"payload":"twice"'*) printf '0 >done\n0 >done\n' ;;
	*'"payload":"partial"'*) printf '0 >do'; sleep 600 ;;
	*'"payload":"exit"'*) exit 3 ;;
	*) echo '0 >done' ;;
	esac
done
`

// Proves: a message stage that breaks the protocol costs at most the message
// at hand (docs/protocol.md, "Failures of the worker itself"): the worker is
// replaced, every other message ends done, and nothing is left pending or
// running.
func TestAMessageStageThatBreaksTheProtocolLosesNothing(t *testing.T) {
	cases := []struct {
		name    string
		payload string // the bad message's payload ("" for eager)
		eager   bool
		status  string // what becomes of the bad message
		reason  string // part of its dispatch_error
		log     string // part of the dispatcher's log
	}{
		{name: "answers before it read", eager: true, log: "broke the protocol"},
		{name: "answers twice", payload: "twice", status: "done", log: "broke the protocol"},
		// The partial "0 >do" hangs until MAX_RUNTIME; the worker is killed and
		// the partial line, cut off by the kill, is dropped, not taken as an
		// answer: the message times out.
		{name: "partial line", payload: "partial", status: "timeout", reason: "no answer within MAX_RUNTIME", log: "had no newline when it ended"},
		{name: "exits mid-pipeline", payload: "exit", status: "failed", reason: "crashed", log: "crashed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, `
[pepsi-dispatch]
MAX_RUNTIME = 3

[stage-f]
PROGRAM = @DIR@/filter
INPUT = message
PARALLELISM = 1
QUEUE_LIMIT = 4
`)
			if err := os.WriteFile(filepath.Join(e.dir, "filter"), []byte(abuseFilter), 0o755); err != nil {
				t.Fatal(err)
			}
			if tc.eager {
				if err := os.WriteFile(filepath.Join(e.dir, "eager"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			// A first message, so the bad one does not meet a worker that has
			// never answered (whose death is a failed start, not a crash).
			e.insert("f", "ok")
			var bad int64
			if tc.payload != "" {
				time.Sleep(200 * time.Millisecond)
				bad = e.insert("f", tc.payload)[0]
			}
			e.insert("f", "ok", "ok", "ok", "ok", "ok", "ok")
			d := e.start()
			waitFor(t, 30*time.Second, "every message final", func() (bool, string) {
				c, err := e.counts()
				return err == nil && c["pending"] == 0 && c["running"] == 0 && c["paused"] == 0, fmtCounts(c)
			})
			d.stopClean()
			wantDone := int64(7)
			if bad != 0 {
				e.expectRow(bad, tc.status, "f", tc.reason)
				if tc.status == "done" {
					wantDone++
				}
			}
			if n := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE status = 'done'`); n != wantDone {
				t.Errorf("%d messages done; want %d (every message but the bad one)", n, wantDone)
			}
			if !strings.Contains(d.logs.String(), tc.log) {
				t.Errorf("the dispatcher's log does not say %q", tc.log)
			}
		})
	}
}
