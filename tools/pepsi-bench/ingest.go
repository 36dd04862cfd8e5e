package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The ingest figure (issue 10): single-row INSERTs into pepsi.queue from
// -clients pgbench clients while pepsi-dispatch runs the pipeline, with the
// queue's insert triggers (schema 4: NOTIFY only while the dispatcher waits;
// schema 6: producers hold a shared advisory lock while mid-transaction) and
// with both disabled (ALTER TABLE … DISABLE TRIGGER USER, in the bench's own
// database), side by side in one run: once with the dispatcher idle (the queue
// empty when pgbench starts) and once busy (a backlog it cannot finish during
// the run). Only the ratio means much on a shared machine.

// ingestScript is pgbench's transaction: one message, committed on its own.
const ingestScript = "INSERT INTO pepsi.queue (stage, payload) VALUES ('a', '\\x696e67657374');\n"

// alwaysNotifySQL is the trigger function of schemas 1 to 3, which notified on
// every insert statement: measured too, for reference.
const alwaysNotifySQL = `CREATE OR REPLACE FUNCTION pepsi.notify_ingress() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ingress', '');
    RETURN NULL;
END
$$`

// The trigger variants, in the order they are measured.
const (
	triggerNone   = iota // ALTER TABLE … DISABLE TRIGGER USER: both of the queue's triggers
	triggerAlways        // schemas 1–3: NOTIFY on every insert
	triggerGate          // this schema: NOTIFY only while the dispatcher waits, and the producers' lock
)

// ingestSettle is how long the dispatcher runs before pgbench starts (its
// workers started, the backlog being claimed, or resting when idle).
const ingestSettle = time.Second

// ingestPoke is how often the bench notifies the dispatcher in the no-trigger
// runs (see ingestRun).
const ingestPoke = 5 * time.Millisecond

// poke sends NOTIFY ingress every ingestPoke until ctx ends.
func (b *bench) poke(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, b.url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tick := time.NewTicker(ingestPoke)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if _, err := conn.Exec(ctx, "SELECT pg_notify('ingress', '')"); err != nil && ctx.Err() == nil {
				return err
			}
		}
	}
}

// ingest prints the ingest figure.
func (b *bench) ingest(ctx context.Context) error {
	if b.ingestSeconds <= 0 || b.skipPgbench {
		return nil
	}
	conn, err := b.migrated(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// The pipeline the dispatcher runs meanwhile: stages that answer their
	// transitions, at the bench configuration.
	confFile, err := b.writeConf(variant{mode: modeAnswer, cfg: b.benchConfig}, "60s", "ingest")
	if err != nil {
		return err
	}
	script := filepath.Join(b.dir, "ingest.sql")
	if err := os.WriteFile(script, []byte(ingestScript), 0o600); err != nil {
		return err
	}
	// The backlog of the busy case: more than the pipeline finishes during the
	// run at any plausible speed.
	backlog := max(b.n, 20000*b.ingestSeconds)
	fmt.Fprintf(b.out, "ingest: pgbench -c %d -j 2 -T %d, one single-row INSERT into pepsi.queue per transaction, pepsi-dispatch running the pipeline:\n",
		b.clients, b.ingestSeconds)
	var gateDef string
	if err := conn.QueryRow(ctx, "SELECT pg_get_functiondef('pepsi.notify_ingress'::regproc)").Scan(&gateDef); err != nil {
		return fmt.Errorf("read the trigger function: %w", err)
	}
	for _, busy := range []bool{false, true} {
		var tps [3]float64
		left := int64(-1)
		for _, variant := range []int{triggerNone, triggerAlways, triggerGate} {
			n := 0
			if busy {
				n = backlog
			}
			def := gateDef
			if variant == triggerAlways {
				def = alwaysNotifySQL
			}
			if _, err := conn.Exec(ctx, def); err != nil {
				return fmt.Errorf("set the trigger function: %w", err)
			}
			r, pending, err := b.ingestRun(ctx, conn, confFile, script, variant != triggerNone, n)
			if err != nil {
				return err
			}
			tps[variant] = r
			if variant == triggerGate {
				left = pending
			}
		}
		what := "idle (empty queue)"
		note := ""
		if busy {
			what = fmt.Sprintf("busy (backlog %d)", backlog)
			note = fmt.Sprintf("; %d of the backlog still pending at the end", left)
		}
		fmt.Fprintf(b.out, "  dispatcher %s: no trigger %.0f tps; this schema's triggers (4 and 6) %.0f tps = %.2f× the no-trigger rate (notify-always trigger of schemas 1-3: %.0f tps = %.2f×)%s\n",
			what, tps[triggerNone], tps[triggerGate], tps[triggerGate]/tps[triggerNone],
			tps[triggerAlways], tps[triggerAlways]/tps[triggerNone], note)
	}
	return nil
}

// ingestRun empties the queue, enqueues backlog messages, enables or disables
// the insert trigger, starts pepsi-dispatch, runs pgbench, and returns its tps and
// how many messages were still pending at stage a when it ended.
func (b *bench) ingestRun(ctx context.Context, conn *pgx.Conn, confFile, script string, trigger bool, backlog int) (tps float64, pending int64, err error) {
	able := "DISABLE"
	if trigger {
		able = "ENABLE"
	}
	for _, sql := range []string{
		"TRUNCATE pepsi.queue",
		fmt.Sprintf("INSERT INTO pepsi.queue (stage, payload) SELECT 'a', convert_to('message ' || g, 'UTF8') FROM generate_series(1, %d) g", backlog),
		"VACUUM ANALYZE pepsi.queue",
		"ALTER TABLE pepsi.queue " + able + " TRIGGER USER", // the gate's (schema 4) and the producers' (schema 6)
		"CHECKPOINT",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return 0, 0, fmt.Errorf("%s: %w", sql, err)
		}
	}
	d, err := b.startDispatcher(confFile, "ingest")
	if err != nil {
		return 0, 0, err
	}
	// Killed on an early return; once it has stopped, Kill does nothing.
	defer d.Kill()
	select {
	case <-time.After(ingestSettle):
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	if !trigger {
		// Without a trigger the dispatcher would never hear of the inserted rows
		// and would run no pipeline, so the no-trigger rate would not pay for the
		// work the trigger's runs do. The bench itself notifies every
		// ingestPoke instead, on a connection of its own: the dispatcher claims
		// and runs what the producers insert, and the producers pay nothing.
		nctx, stopNotify := context.WithCancel(ctx)
		notified := make(chan error, 1)
		go func() { notified <- b.poke(nctx) }()
		defer func() {
			stopNotify()
			<-notified
		}()
	}
	if tps, err = b.pgbenchTPS(ctx, script, b.ingestSeconds); err != nil {
		return 0, 0, err
	}
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pepsi.queue WHERE status = 'pending' AND stage = 'a' AND payload <> '\\x696e67657374'").Scan(&pending); err != nil {
		return 0, 0, fmt.Errorf("count the backlog: %w", err)
	}
	if code, err := d.Stop(stopWait); err != nil || code != 0 {
		return 0, 0, fmt.Errorf("pepsi-dispatch exited with status %d after SIGTERM (want 0): %v\n%s", code, err, d.LogTail(logTailLines))
	}
	return tps, pending, nil
}

// pgbenchTPS runs script with pgbench from b.clients clients for seconds on
// b.url, and returns its transactions per second.
func (b *bench) pgbenchTPS(ctx context.Context, script string, seconds int) (float64, error) {
	args := []string{"-n", "-c", strconv.Itoa(b.clients), "-j", "2", "-T", strconv.Itoa(seconds), "-f", script, b.url}
	cmd := exec.CommandContext(ctx, b.pgbench, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("%s %s: %w\n%s", b.pgbench, strings.Join(args, " "), err, out.Bytes())
	}
	return parseTPS(out.Bytes())
}
