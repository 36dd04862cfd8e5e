package dispatch_test

import (
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/netfault"
	"github.com/pepsi-pipeline/pepsi/shell/worker"
	"github.com/pepsi-pipeline/pepsi/stage/relay"
)

// relayConf is one INPUT = message stage whose worker (relaystage) carries its
// standard input and output over TCP to the stage on the "far host".
const relayConf = `
[stage-f]
PROGRAM = @BIN@/relaystage
INPUT = message
PARALLELISM = 1
QUEUE_LIMIT = 16
MAX_MESSAGES = 100000
`

// startRelay runs the far host: a stage/relay server that starts filterstage
// for each connection (with no database in its environment), behind the fault
// proxy with latency added to every chunk in each direction; the dispatcher's
// workers reach it through the proxy.
func startRelay(t *testing.T, e *env, latency time.Duration) *netfault.Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !worker.NamesDatabase(kv) {
			env = append(env, kv)
		}
	}
	env = append(env, "PEPSI_STAGE=f", "PEPSI_INPUT=message", "TESTSTAGE_RECORD="+filepath.Join(e.dir, "record"))
	done := make(chan error, 1)
	go func() {
		done <- relay.Serve(ln, []string{filepath.Join(binDir, "filterstage"), "worker"}, env, io.Discard, slog.New(slog.DiscardHandler))
	}()
	proxy, err := netfault.Start(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	proxy.SetLatency(latency)
	t.Cleanup(func() {
		proxy.Close()
		ln.Close()
		if err := <-done; err != nil {
			t.Errorf("relay server: %v", err)
		}
	})
	e.workerEnv = append(os.Environ(), "PEPSI_RELAY_ADDR="+proxy.Addr())
	return proxy
}

// Proves: a message stage runs behind a TCP relay with 10 ms added to each
// round trip (PROGRAM a wrapper, as "ssh host stage" is), every message ends
// done, and the dispatcher keeps QUEUE_LIMIT messages in flight across the
// link: the far stage reads many at once instead of one per round trip.
// (Throughput through the relay is measured by pepsi-bench, not asserted here.)
func TestAMessageStageBehindATCPRelayIsPipelined(t *testing.T) {
	t.Parallel()
	e := newEnv(t, relayConf)
	startRelay(t, e, 5*time.Millisecond)
	e.insertN("f", "", 300)
	d := e.start()
	e.waitCounts(60*time.Second, map[string]int{"done": 300})
	d.stopClean()
	most := 0
	for _, r := range e.records("handle") {
		most = max(most, r.Outstanding)
	}
	if most < 8 {
		t.Errorf("the far stage held at most %d messages at once; want at least 8 of QUEUE_LIMIT 16 pipelined over the link", most)
	}
}

// Proves: a connection cut in the middle of the pipeline is a crash of that
// worker: its head-of-line message fails with a crash reason, the rest of its
// pipeline is requeued and runs on a new connection, and nothing is lost or left
// running.
func TestACutRelayConnectionIsACrashAndLosesNothing(t *testing.T) {
	t.Parallel()
	const n = 1000
	e := newEnv(t, relayConf)
	proxy := startRelay(t, e, 5*time.Millisecond)
	e.insertN("f", "", n)
	d := e.start()
	waitFor(t, 30*time.Second, "some messages done", func() (bool, string) {
		c, err := e.counts()
		return err == nil && c["done"] >= 100, fmtCounts(c)
	})
	proxy.ResetAll()
	waitFor(t, 60*time.Second, "every message final", func() (bool, string) {
		c, err := e.counts()
		return err == nil && c["done"]+c["failed"] == n, fmtCounts(c)
	})
	d.stopClean()
	// The worker almost always holds messages in flight when the link is cut;
	// if it held none, the crash fails nothing.
	failed := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE status = 'failed'`)
	crashed := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE status = 'failed' AND state ->> 'dispatch_error' LIKE '%crashed%'`)
	s := e.stageStats()["f"]
	if s.Crashes < 1 || failed != crashed || failed > s.Crashes {
		t.Errorf("%d messages failed, %d of them as a crash, %d crashes counted; want at least one crash, and at most its head failed per crash, as a crash",
			failed, crashed, s.Crashes)
	}
	if logs := d.logs.String(); !strings.Contains(logs, "crashed") && !strings.Contains(logs, "died unexpectedly") {
		t.Errorf("no crash in the dispatcher's log")
	}
}
