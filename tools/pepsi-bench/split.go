package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/core"
)

// The split figure (-split N, issue 32): a stage that splits its messages.
// N messages wait at stage a; a's stage emits splitChildren messages to stage
// b for each (emit lines, docs/protocol.md "Emitting messages") and answers
// "0 >done"; b's stage answers "0 >done" for each child. Both stages are
// answer-mode programs (no database connection), so the figure is the
// dispatcher's: it inserts the children in the batched transaction that
// writes their parents' transitions. Emitted messages per second =
// splitChildren × N / (the dispatcher's start to the last message done, the
// children's pass at b included). Beside it, in each round, pgbench's
// -clients clients insert single rows into pepsi.queue, one per transaction
// (the queue's triggers on, no dispatcher running): the rate a producer
// outside PEPSI inserts messages at.

// splitProgram is the name under which pepsi-bench runs as the split
// figure's stage program, through a link like answerProgram's.
const splitProgram = "pepsi-bench-split"

// splitChildren is how many messages stage a emits per message.
const splitChildren = 10

// splitAnswer is the split program's output for one message at stage: at a,
// splitChildren emit lines to b then "0 >done"; at b, "0 >done".
func splitAnswer(stage string) (string, bool) {
	done := core.Status{Transition: &core.Transition{To: core.TargetDone}}.Line()
	switch stage {
	case stageA:
		lines := make([]string, 0, splitChildren+1)
		for i := range splitChildren {
			lines = append(lines, core.Emit{Stage: stageB, Payload: []byte("child " + strconv.Itoa(i))}.Line())
		}
		return strings.Join(append(lines, done), "\n"), true
	case stageB:
		return done, true
	}
	return "", false
}

// splitMain is the split figure's stage program.
func splitMain(stdin io.Reader, stdout, stderr io.Writer, stage string) int {
	answer, ok := splitAnswer(stage)
	if !ok {
		fmt.Fprintf(stderr, "%s: PEPSI_STAGE=%q is neither of the split figure's stages a and b\n", splitProgram, stage)
		return 2
	}
	if err := answerLoop(stdin, stdout, answer); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", splitProgram, err)
		return 1
	}
	return 0
}

// runSplitWorker is main for the split figure's stage program.
func runSplitWorker() {
	os.Exit(splitMain(os.Stdin, os.Stdout, os.Stderr, os.Getenv("PEPSI_STAGE")))
}

// splitConf is the split figure's pepsi.conf: stages a and b, both served by
// the split program, at the bench configuration, but for a's PARALLELISM
// and QUEUE_LIMIT where -split-parallelism and -split-queue-limit set them.
func (b *bench) splitConf(program string, sessions int) string {
	text := fmt.Sprintf(confTemplate, b.url, "60") + sessionsLine(sessions)
	text += fmt.Sprintf(stageTemplate, stageA, program, cmp.Or(b.splitParent.parallelism, b.benchConfig.parallelism),
		cmp.Or(b.splitParent.queueLimit, b.benchConfig.queueLimit), b.benchConfig.maxMessages)
	text += fmt.Sprintf(stageTemplate, stageB, program, b.benchConfig.parallelism, b.benchConfig.queueLimit, b.benchConfig.maxMessages)
	return text
}

// runSplits measures the split figure -rounds times, side by side with
// pgbench, and prints each round and the medians.
func (b *bench) runSplits(ctx context.Context) error {
	program := filepath.Join(b.dir, splitProgram)
	if err := os.Symlink(b.self, program); err != nil {
		return fmt.Errorf("the split stage program: %w", err)
	}
	confFile := filepath.Join(b.dir, "bench.split.conf")
	if err := os.WriteFile(confFile, []byte(b.splitConf(program, b.benchConfig.sessions)), 0o600); err != nil {
		return err
	}
	singleFile := filepath.Join(b.dir, "bench.split-single.conf")
	if err := os.WriteFile(singleFile, []byte(b.splitConf(program, 1)), 0o600); err != nil {
		return err
	}
	script := filepath.Join(b.dir, "ingest.sql")
	if err := os.WriteFile(script, []byte(ingestScript), 0o600); err != nil {
		return err
	}
	fmt.Fprintf(b.out, "pepsi-bench -split: %d rounds; pgbench -c %d -j 2 -T %d, one single-row INSERT into pepsi.queue per transaction (no dispatcher); "+
		"split a (emits %d messages to b, answers 0 >done) -> b (answers 0 >done), %d messages (%d emitted), PARALLELISM %d, QUEUE_LIMIT %d%s\n",
		b.rounds, b.clients, b.seconds, splitChildren, b.splitN, splitChildren*b.splitN, b.benchConfig.parallelism, b.benchConfig.queueLimit, b.splitParentText())
	var tpss, rates, ratios, gains []float64
	for i := 1; i <= b.rounds; i++ {
		tps, err := b.queueInserts(ctx, script)
		if err != nil {
			return fmt.Errorf("round %d: pgbench: %w", i, err)
		}
		elapsed, txns, err := b.runSplit(ctx, confFile)
		if err != nil {
			return fmt.Errorf("round %d: split: %w", i, err)
		}
		rate := float64(splitChildren*b.splitN) / elapsed.Seconds()
		tpss, rates, ratios = append(tpss, tps), append(rates, rate), append(ratios, rate/tps)
		fmt.Fprintf(b.out, "round %d: pgbench %.0f inserts/s; split%s: %.0f emitted messages/s (%s for %d parents and their children; %s) = %.2f× pgbench\n",
			i, tps, sessionsText(b.benchConfig.sessions), rate, elapsed.Round(time.Millisecond), b.splitN, txns, rate/tps)
		if !b.splitSingle {
			continue
		}
		elapsed, txns, err = b.runSplit(ctx, singleFile)
		if err != nil {
			return fmt.Errorf("round %d: split, SESSIONS = 1: %w", i, err)
		}
		single := float64(splitChildren*b.splitN) / elapsed.Seconds()
		gains = append(gains, rate/single)
		fmt.Fprintf(b.out, "round %d: split, SESSIONS = 1: %.0f emitted messages/s (%s; %s) = %.2f× pgbench; the split%s makes %.2f× as many\n",
			i, single, elapsed.Round(time.Millisecond), txns, single/tps, sessionsText(b.benchConfig.sessions), rate/single)
	}
	fmt.Fprintf(b.out, "medians of %d rounds: pgbench %.0f inserts/s, split %.0f emitted messages/s; split × pgbench %.2f× (the median of the rounds' ratios; %.2f–%.2f)\n",
		b.rounds, median(tpss), median(rates), median(ratios), slices.Min(ratios), slices.Max(ratios))
	if len(gains) > 0 {
		fmt.Fprintf(b.out, "split%s ÷ split at SESSIONS = 1: %.2f× (the median of the rounds' ratios; %.2f–%.2f)\n",
			sessionsText(b.benchConfig.sessions), median(gains), slices.Min(gains), slices.Max(gains))
	}
	return nil
}

// sessionsText names a SESSIONS the configuration sets ("" for none).
func sessionsText(n int) string {
	if n <= 0 {
		return ""
	}
	return fmt.Sprintf(" at SESSIONS = %d", n)
}

// queueInserts runs pgbench's single-row INSERTs into pepsi.queue on a fresh
// database and returns its transactions per second.
func (b *bench) queueInserts(ctx context.Context, script string) (float64, error) {
	conn, err := b.migrated(ctx)
	if err != nil {
		return 0, err
	}
	conn.Close(context.WithoutCancel(ctx))
	return b.pgbenchTPS(ctx, script, b.seconds)
}

// runSplit enqueues b.splitN messages at stage a on a fresh database, runs
// pepsi-dispatch on confFile until every message and child is done, checks
// the outcome (each parent done with exactly its children, all of them done)
// and returns the time from the dispatcher's start to the last done, and its
// transactions.
func (b *bench) runSplit(ctx context.Context, confFile string) (time.Duration, string, error) {
	conn, err := b.migrated(ctx)
	if err != nil {
		return 0, "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, sql := range []string{
		fmt.Sprintf("INSERT INTO pepsi.queue (stage, payload) SELECT 'a', convert_to('message ' || g, 'UTF8') FROM generate_series(1, %d) g", b.splitN),
		"VACUUM ANALYZE pepsi.queue", "CHECKPOINT",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return 0, "", fmt.Errorf("%s: %w", sql, err)
		}
	}
	var start time.Time
	if err := conn.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&start); err != nil {
		return 0, "", fmt.Errorf("read the server clock: %w", err)
	}
	b.dispatchEnv = nil
	d, err := b.startDispatcher(confFile, "split")
	if err != nil {
		return 0, "", err
	}
	defer d.Kill()
	total := (1 + splitChildren) * b.splitN
	err = b.poll(ctx, d, variant{mode: modeAnswer, cfg: b.benchConfig}, total, "messages out of the pipeline", func() (int64, error) {
		var left int64
		err := conn.QueryRow(ctx, "SELECT messages_left FROM pepsi.dispatch_stats").Scan(&left)
		return left, err
	})
	if err != nil {
		return 0, "", err
	}
	var end time.Time
	if err := conn.QueryRow(ctx, "SELECT max(updated_at) FROM pepsi.queue WHERE status = 'done'").Scan(&end); err != nil {
		return 0, "", fmt.Errorf("read the last done time: %w", err)
	}
	if code, err := d.Stop(stopWait); err != nil || code != 0 {
		return 0, "", fmt.Errorf("pepsi-dispatch exited with status %d after SIGTERM (want 0): %v\n%s", code, err, d.LogTail(logTailLines))
	}
	if err := verifySplit(ctx, conn, b.splitN); err != nil {
		return 0, "", fmt.Errorf("%w\n%s", err, d.LogTail(logTailLines))
	}
	return end.Sub(start), transactions(d), nil
}

// verifySplit checks that n parents are done with splitChildren children
// each, all done at b, so a fast but wrong run cannot pass.
func verifySplit(ctx context.Context, conn *pgx.Conn, n int) error {
	var parents, children, wrong int64
	err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE stage = 'a' AND status = 'done' AND parent_id IS NULL),
		count(*) FILTER (WHERE stage = 'b' AND status = 'done' AND parent_id IS NOT NULL),
		(SELECT count(*) FROM (SELECT parent_id FROM pepsi.queue WHERE parent_id IS NOT NULL GROUP BY 1 HAVING count(*) <> $1) x)
		FROM pepsi.queue`, splitChildren).Scan(&parents, &children, &wrong)
	if err != nil {
		return fmt.Errorf("read the outcome: %w", err)
	}
	if parents != int64(n) || children != int64(splitChildren*n) || wrong != 0 {
		return fmt.Errorf("%d parents done at a, %d children done at b, %d parents with other than %d children; want %d, %d and 0",
			parents, children, wrong, splitChildren, n, splitChildren*n)
	}
	return nil
}

// splitParentText says how the split figure's stage a differs from the bench
// configuration, "" when it does not.
func (b *bench) splitParentText() string {
	if b.splitParent.parallelism == 0 && b.splitParent.queueLimit == 0 {
		return ""
	}
	return fmt.Sprintf(" (stage a: PARALLELISM %d, QUEUE_LIMIT %d)",
		cmp.Or(b.splitParent.parallelism, b.benchConfig.parallelism), cmp.Or(b.splitParent.queueLimit, b.benchConfig.queueLimit))
}
