package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// backlogStatsInterval is the dispatcher's STATS_INTERVAL in a backlog drain:
// its statistics, flushed this often, are the drain's progress over time.
const backlogStatsInterval = "1"

// progressSample is the dispatcher's count of stage passes as of one flush of
// its statistics.
type progressSample struct {
	at     time.Time
	passes int64
}

// queueSizes are pepsi.queue's on-disk sizes.
type queueSizes struct {
	table, indexes int64 // pg_relation_size, pg_indexes_size: bytes
}

func (s queueSizes) String() string {
	return fmt.Sprintf("table %.1f MB, indexes %.1f MB", mb(s.table), mb(s.indexes))
}

func mb(n int64) float64 { return float64(n) / (1 << 20) }

// backlogResult is what one drain of the backlog found.
type backlogResult struct {
	messages    int
	elapsed     time.Duration
	first, last float64 // hops/s over the first and the last tenth of the drain
	// firstCPU and lastCPU are the CPU time per hop, µs, of the dispatcher,
	// its workers and their backends over the same tenths: what the hops
	// cost, which the machine's other load disturbs far less than the rates.
	// 0 if unknown (the server is not on this machine).
	firstCPU, lastCPU float64
	before, after     queueSizes
	autovacuum        string // the server's autovacuum setting: on or off
	// vacuums and autovacuums are how many times the queue was vacuumed during
	// the drain (by the dispatcher or anyone else, and by autovacuum); dead is
	// its dead row versions at the end. -1 if unknown.
	vacuums, autovacuums, dead int64
	// history is pepsi.history at the end: its rows (one per pass, none
	// with HISTORY = off) and its partitions' sizes.
	historyRows int64
	history     queueSizes
}

func (r backlogResult) String() string {
	hops := float64(hopsPerMessage*r.messages) / r.elapsed.Seconds()
	return fmt.Sprintf("%d messages (%d hops) in %.1f s = %.0f hops/s; first tenth %.0f hops/s, last tenth %.0f hops/s (last/first %.2f); "+
		"pepsi.queue before: %s; after: %s",
		r.messages, hopsPerMessage*r.messages, r.elapsed.Seconds(), hops, r.first, r.last, r.last/r.first, r.before, r.after) +
		r.cpuText() +
		fmt.Sprintf("; vacuums during the drain %d, autovacuums %d, dead row versions at the end %d", r.vacuums, r.autovacuums, r.dead) +
		fmt.Sprintf("; pepsi.history after: %d rows, %s", r.historyRows, r.history) +
		autovacuumNote(r.autovacuum)
}

// cpuText is the CPU per hop over the first and the last tenth, "" if
// unknown.
func (r backlogResult) cpuText() string {
	if r.firstCPU <= 0 || r.lastCPU <= 0 {
		return ""
	}
	return fmt.Sprintf("; CPU per hop (dispatcher, workers, backends) first tenth %.0f µs, last tenth %.0f µs (last/first %.2f)",
		r.firstCPU, r.lastCPU, r.lastCPU/r.firstCPU)
}

// autovacuumNote warns that a drain ran without autovacuum: every hop leaves
// dead row versions that nothing reclaims during the drain, so the figures are
// not those of a server as it is usually run.
func autovacuumNote(setting string) string {
	if setting == "on" {
		return ""
	}
	return fmt.Sprintf("\n  NOTE: the server runs with autovacuum = %s: only a VACUUM of someone else's (the dispatcher's) reclaimed dead row versions during the drain", setting)
}

// runBacklogs drains a backlog of -backlog-n messages in each mode at each
// of -backlog-configs (the bench configuration by default), one after the
// other.
func (b *bench) runBacklogs(ctx context.Context) error {
	fmt.Fprintf(b.out, "pepsi-bench -backlog: %d messages enqueued at once, drained through a -> b -> c -> done at %s, modes %s\n",
		b.backlogN, joinConfigs(b.backlogConfigs), joinModes(b.modes))
	for _, m := range b.modes {
		for _, c := range b.backlogConfigs {
			v := variant{mode: m, cfg: c}
			r, err := b.runBacklog(ctx, v)
			if errors.Is(err, errRefused) {
				b.refuse(m, err)
				continue
			}
			if err != nil {
				return fmt.Errorf("backlog, %s: %w", v, err)
			}
			fmt.Fprintf(b.out, "backlog, %s: %s\n", v, r)
		}
	}
	return b.refusedError()
}

// runBacklog enqueues the backlog, starts pepsi-dispatch, samples its progress
// from its statistics (flushed every second), and reports the rate over the
// first and the last tenth of the drain's time and the queue's sizes before
// the drain and after it.
func (b *bench) runBacklog(ctx context.Context, v variant) (backlogResult, error) {
	r := backlogResult{messages: b.backlogN}
	conn, err := b.freshQueue(ctx, b.backlogN, stageConfig{})
	if err != nil {
		return r, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if r.before, err = sizes(ctx, conn); err != nil {
		return r, err
	}
	if err := conn.QueryRow(ctx, "SHOW autovacuum").Scan(&r.autovacuum); err != nil {
		return r, fmt.Errorf("read the autovacuum setting: %w", err)
	}
	var vacuums0, autovacuums0 int64 // freshQueue's VACUUM ANALYZE counts one
	vacuumsKnown := conn.QueryRow(ctx, `SELECT vacuum_count, autovacuum_count FROM pg_stat_user_tables
		WHERE relid = 'pepsi.queue'::regclass`).Scan(&vacuums0, &autovacuums0) == nil
	tag := "backlog-" + string(v.mode) + "-" + v.cfg.name
	confFile, err := b.writeConf(v, backlogStatsInterval, tag)
	if err != nil {
		return r, err
	}
	var start time.Time
	if err := conn.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&start); err != nil {
		return r, fmt.Errorf("read the server clock: %w", err)
	}
	d, err := b.startDispatcherOf(v.cfg, confFile, tag)
	if err != nil {
		return r, err
	}
	// Killed on an early return; once it has stopped, Kill does nothing.
	defer d.Kill()
	// samples are the dispatcher's flushes; cpu, read at each new flush, the
	// CPU time (µs) its processes and their backends had taken by then, from
	// none at the start (a read that fails, as a backend ends, is skipped).
	var samples []progressSample
	cpu := []progressSample{{at: start}}
	record := func(at time.Time, passes int64) {
		if n := len(samples); n == 0 || samples[n-1].at != at {
			samples = append(samples, progressSample{at: at, passes: passes})
			now := time.Now()
			if c, ok := drainCPU(ctx, conn, d.Pid()); ok {
				cpu = append(cpu, progressSample{at: now, passes: c.Microseconds()})
			}
		}
	}
	if err := b.wait(ctx, conn, d, v, b.backlogN, record); err != nil {
		return r, err
	}
	var end time.Time
	if err := conn.QueryRow(ctx, "SELECT max(updated_at) FROM pepsi.queue WHERE status = 'done'").Scan(&end); err != nil {
		return r, fmt.Errorf("read the last done time: %w", err)
	}
	if err := b.stopAndVerify(ctx, conn, d, b.backlogN); err != nil {
		return r, err
	}
	if r.after, err = sizes(ctx, conn); err != nil {
		return r, err
	}
	if err := conn.QueryRow(ctx, historySizesSQL).Scan(&r.historyRows, &r.history.table, &r.history.indexes); err != nil {
		return r, fmt.Errorf("read pepsi.history's rows and sizes: %w", err)
	}
	r.vacuums, r.autovacuums, r.dead = -1, -1, -1
	if _, ok := queueUpdates(ctx, conn); ok && vacuumsKnown { // once the backends have reported
		var vacuums, autovacuums, dead int64
		if conn.QueryRow(ctx, `SELECT vacuum_count, autovacuum_count, n_dead_tup FROM pg_stat_user_tables
			WHERE relid = 'pepsi.queue'::regclass`).Scan(&vacuums, &autovacuums, &dead) == nil {
			r.vacuums, r.autovacuums, r.dead = vacuums-vacuums0, autovacuums-autovacuums0, dead
		}
	}
	r.elapsed = end.Sub(start)
	total := int64(hopsPerMessage * b.backlogN)
	if r.first, r.last, err = tenthRates(samples, start, end, total); err != nil {
		return r, err
	}
	r.firstCPU, r.lastCPU = tenthCPU(cpu, samples, start, end, total)
	return r, nil
}

// tenthCPU is the CPU time per hop, µs, over the first and the last tenth of
// the drain's time: the CPU taken by the tenths' boundaries (interpolated
// between the cpu samples, µs in passes, from 0 at start) over the passes
// made in between (interpolated between the dispatcher's flushes, as
// tenthRates does). 0 for a tenth without a sample after it.
func tenthCPU(cpu, samples []progressSample, start, end time.Time, total int64) (first, last float64) {
	pts := []progressSample{{at: start}}
	for _, s := range samples {
		if s.at.After(start) && s.at.Before(end) {
			pts = append(pts, s)
		}
	}
	pts = append(pts, progressSample{at: end, passes: total})
	sort.SliceStable(pts, func(i, j int) bool { return pts[i].at.Before(pts[j].at) })
	sort.SliceStable(cpu, func(i, j int) bool { return cpu[i].at.Before(cpu[j].at) })
	tenth := end.Sub(start) / 10
	perHop := func(from, to time.Time) float64 {
		hops := passesAt(pts, to) - passesAt(pts, from)
		if hops <= 0 || len(cpu) == 0 || cpu[len(cpu)-1].at.Before(to) {
			return 0
		}
		return float64(passesAt(cpu, to)-passesAt(cpu, from)) / float64(hops)
	}
	return perHop(start, start.Add(tenth)), perHop(end.Add(-tenth), end)
}

// drainCPU is the CPU time the dispatcher (pid) has taken so far with its
// workers, living (its children) and reaped, and the backends connected to
// the bench database but conn's: what the drain has cost. ok is false when
// any of it cannot be read.
func drainCPU(ctx context.Context, conn *pgx.Conn, pid int) (cpu time.Duration, ok bool) {
	backends, ok := backendsCPU(ctx, conn)
	if !ok {
		return 0, false
	}
	// The dispatcher's own time and its reaped children's (fields 14 to 17).
	own, ok := procCPU(pid, 4)
	if !ok {
		return 0, false
	}
	kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return 0, false
	}
	for _, f := range strings.Fields(string(kids)) {
		kid, err := strconv.Atoi(f)
		if err != nil {
			return 0, false
		}
		if c, ok := procCPU(kid, 2); ok { // (a worker that has just exited is counted once reaped)
			own += c
		}
	}
	return backends + own, true
}

// procCPU sums the first n of the times in /proc/PID/stat from utime on
// (utime, stime, cutime, cstime).
func procCPU(pid, n int) (time.Duration, bool) {
	text, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	rest := string(text)
	if i := strings.LastIndexByte(rest, ')'); i >= 0 { // the command may hold spaces
		rest = rest[i+1:]
	}
	f := strings.Fields(rest)
	if len(f) < 11+n {
		return 0, false
	}
	var ticks int64
	for _, s := range f[11 : 11+n] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, false
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks, true
}

// historySizesSQL reads pepsi.history's rows and the sizes of its daily
// partitions, heap and indexes (the parent holds nothing).
const historySizesSQL = `SELECT (SELECT count(*) FROM pepsi.history),
	coalesce(sum(pg_relation_size(i.inhrelid)), 0)::bigint, coalesce(sum(pg_indexes_size(i.inhrelid)), 0)::bigint
FROM pg_inherits i WHERE i.inhparent = 'pepsi.history'::regclass`

func sizes(ctx context.Context, conn *pgx.Conn) (queueSizes, error) {
	var s queueSizes
	err := conn.QueryRow(ctx, "SELECT pg_relation_size('pepsi.queue'), pg_indexes_size('pepsi.queue')").Scan(&s.table, &s.indexes)
	if err != nil {
		return s, fmt.Errorf("read pepsi.queue's sizes: %w", err)
	}
	return s, nil
}

// tenthRates is the hops/s over the first and the last tenth of the drain's
// time, from start (no pass yet) to end (all total passes made), with the
// passes at the tenths' boundaries interpolated between the samples.
func tenthRates(samples []progressSample, start, end time.Time, total int64) (first, last float64, err error) {
	if !end.After(start) {
		return 0, 0, fmt.Errorf("the drain ended (%v) no later than it started (%v)", end, start)
	}
	pts := []progressSample{{at: start}}
	for _, s := range samples {
		if s.at.After(start) && s.at.Before(end) {
			pts = append(pts, s)
		}
	}
	pts = append(pts, progressSample{at: end, passes: total})
	sort.SliceStable(pts, func(i, j int) bool { return pts[i].at.Before(pts[j].at) })
	tenth := end.Sub(start) / 10
	first = float64(passesAt(pts, start.Add(tenth))) / tenth.Seconds()
	last = float64(total-passesAt(pts, end.Add(-tenth))) / tenth.Seconds()
	return first, last, nil
}

// passesAt interpolates the passes made by time t between the samples around
// it; pts is sorted by time and spans t.
func passesAt(pts []progressSample, t time.Time) int64 {
	i := sort.Search(len(pts), func(i int) bool { return !pts[i].at.Before(t) })
	switch {
	case i == 0:
		return pts[0].passes
	case i == len(pts):
		return pts[len(pts)-1].passes
	}
	a, z := pts[i-1], pts[i]
	f := float64(t.Sub(a.at)) / float64(z.at.Sub(a.at))
	return a.passes + int64(f*float64(z.passes-a.passes))
}
