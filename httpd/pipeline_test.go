package httpd_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/httpd"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/queueadmin"
	"github.com/pepsi-pipeline/pepsi/shell/dispatch"
)

// checkStage is a whole stage in sh and psql (DATABASE is filled in). Of ids
// 1..20 it rejects the multiples of 4 by answering non-zero (the dispatcher
// fails them), fails those of the form 4k+1 itself (status failed, state.error,
// answer 0: a pass ok), and finishes the rest as done.
const checkStage = `#!/bin/sh
while read id; do
	case $((id % 4)) in
	0) echo "1 rejected: id $id is a multiple of 4"; continue ;;
	1) set="status = 'failed', state = state || '{\"error\": \"bad input\"}'" ;;
	*) set="status = 'done'" ;;
	esac
	psql "DATABASE" -qAtc "UPDATE pepsi.queue SET $set WHERE ingress_id = $id AND status = 'running' AND stage = 'check'" >&2 || exit 1
	echo 0
done
`

func TestMetricsFollowARealDispatcherThroughAKnownRun(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	dir := t.TempDir()
	program := filepath.Join(dir, "check-stage")
	if err := os.WriteFile(program, []byte(strings.Replace(checkStage, "DATABASE", url, 1)), 0o755); err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "pepsi.conf")
	text := fmt.Sprintf("[pepsi]\nDATABASE = %s\n[pepsi-dispatch]\nSTATS_INTERVAL = 1s\n[stage-check]\nPROGRAM = %s\nPARALLELISM = 2\n", url, program)
	cfg, err := conf.Parse(cfgFile, text)
	if err != nil {
		t.Fatal(err)
	}
	conn := pgtest.Connect(t, url)
	msgs := make([]queueadmin.NewMessage, 20)
	for i := range msgs {
		msgs[i].Payload = []byte(secretPayload)
	}
	if _, err := queueadmin.Enqueue(ctx, conn, "check", msgs); err != nil {
		t.Fatal(err)
	}

	src := open(t, httpd.Options{Database: url, CacheMaxAge: time.Millisecond, Stages: []string{"check"}})
	srv := httptest.NewServer(httpd.Handler(src, nil))
	defer srv.Close()
	before := values(scrape(t, srv.URL))
	if before[`pepsi_queue_messages{stage=check,status=pending}`] != 20 || before["pepsi_dispatcher_lock_held"] != 0 {
		t.Fatalf("before the run: pending %v, lock %v; want 20, 0", before[`pepsi_queue_messages{stage=check,status=pending}`], before["pepsi_dispatcher_lock_held"])
	}

	dctx, stop := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		code, _ := dispatch.Run(dctx, dispatch.Options{Config: cfg, Database: url, Log: slog.New(slog.DiscardHandler)})
		done <- code
	}()
	// Ids 1..20: 5 rejected by the dispatcher, 5 failed by the stage, 10 done;
	// the dispatcher flushes once idle. The queue's failed count has both kinds,
	// failed_by_dispatcher only its own, and the stage's failures are passes ok.
	want := map[string]float64{
		"pepsi_dispatcher_lock_held":                          1,
		`pepsi_queue_messages{stage=check,status=pending}`:    0,
		`pepsi_queue_messages{stage=check,status=running}`:    0,
		`pepsi_queue_messages{stage=check,status=failed}`:     10,
		`pepsi_stage_passes_ok_total{stage=check}`:            15,
		`pepsi_stage_failed_by_dispatcher_total{stage=check}`: 5,
		`pepsi_stage_watchdog_timeouts_total{stage=check}`:    0,
		`pepsi_stage_worker_crashes_total{stage=check}`:       0,
		"pepsi_dispatch_messages_left_total":                  20,
	}
	var got map[string]float64
	deadline := time.Now().Add(60 * time.Second)
	for {
		got = values(scrape(t, srv.URL))
		same := true
		for k, v := range want {
			same = same && got[k] == v
		}
		if same {
			break
		}
		if time.Now().After(deadline) {
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s = %v, want %v", k, got[k], v)
				}
			}
			t.Fatal("the metrics did not reach the run's end state within 60 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	if code := <-done; code != dispatch.ExitOK {
		t.Errorf("dispatcher exit %d, want %d", code, dispatch.ExitOK)
	}
	if after := values(scrape(t, srv.URL)); after["pepsi_dispatcher_lock_held"] != 0 {
		t.Errorf("after the dispatcher stopped: lock held %v, want 0", after["pepsi_dispatcher_lock_held"])
	}
}
