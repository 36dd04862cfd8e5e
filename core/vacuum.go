package core

import (
	"fmt"
	"time"

	"github.com/pepsi-pipeline/pepsi/core/conf"
)

// Keeping pepsi.queue healthy. Every hop leaves dead row versions behind (the
// claim, the transition, a requeue); a queue table that is not vacuumed decays:
// its partial indexes fill with dead entries the claim must step over, and
// throughput falls. Autovacuum may be off (globally or for the table), tuned
// down, or too lazy for a table that rewrites every row several times a second.
// So the core looks at the queue's health every InspectInterval and, unless
// VACUUM = off, vacuums it itself when dead rows pass VacuumDeadMin and no
// vacuum is running. It also says, once, when autovacuum is off, and when an old
// transaction holds back the xmin horizon (which no vacuum can get past).
//
// The dispatcher's sessions make each statement's plan once and keep it until
// a vacuum or an analyze of the queue (store.SessionParams). Plans made while
// the queue was a few pages (a new install, a drained queue analyzed) read
// the whole queue at every claim of the backlog that comes next: 170 times
// the buffers of the plan made for it at 100,000 messages. So, unless
// VACUUM = off, the core also has the queue analyzed when it has grown past
// twice the size its statistics were taken at, in pages or in live rows
// (OutgrewPlans), which makes every session's plans again; and it looks
// again within InspectGrowthInterval, not InspectInterval, when its claims
// report InspectGrowth rows added since the last look, and as many as the
// queue's live rows then.
const (
	// InspectInterval is how often the core reads the queue's health.
	InspectInterval = 10 * time.Second
	// InspectGrowth: rows added to the queue (ingress ids settled, as the
	// claims report them) since the last inspection that call for the next
	// one sooner, InspectGrowthInterval after the last, if they are as many
	// as the live rows that inspection found too (the queue may have
	// doubled): a steady flow into a large queue keeps the InspectInterval
	// pace.
	InspectGrowth = 10000
	// InspectGrowthInterval: two inspections called for by growth start at
	// least this far apart.
	InspectGrowthInterval = time.Second
	// AnalyzePagesMin: the queue's size in pages (8 KiB each) from which it
	// is analyzed when it has more than doubled since its statistics were
	// taken. Below it every plan reads little, whatever its shape.
	AnalyzePagesMin = 128
	// AnalyzeRowsMin: the queue's live rows from which it is analyzed when
	// they are more than twice the rows its statistics hold.
	AnalyzeRowsMin = 10000
	// plannerPagesMin: PostgreSQL plans a table that was never vacuumed nor
	// analyzed as if it had at least 10 pages.
	plannerPagesMin = 10
	// VacuumDeadMin: the dead row versions in pepsi.queue above which the core
	// vacuums it.
	VacuumDeadMin = 20000
	// VacuumIntervalMin: two vacuums of the core's start at least this far apart.
	VacuumIntervalMin = 5 * time.Second
	// HorizonAgeWarn: an xmin horizon held back this long is worth a warning.
	HorizonAgeWarn = 5 * time.Minute
)

// Inspect asks for the queue's health: its dead and live row versions, whether a
// vacuum of it runs now, whether autovacuum covers it, and the oldest
// transaction that holds back the xmin horizon; and the pending messages of
// stages other than Run (the stages this dispatcher runs), which nothing would
// ever claim. It reads statistics and the pending index only and is not part of
// the step's transaction; answered by Inspected.
type Inspect struct {
	Op  int64
	Run []string
}

// StageCount is a number of messages of one stage.
type StageCount struct {
	Stage string
	N     int64
}

// Vacuum runs VACUUM or ANALYZE (Kind) on pepsi.queue, on a connection of its
// own, off the loop (neither can run in a transaction and either may take a
// while). Answered by Vacuumed. Nothing needs to be durable first: it only
// removes dead row versions and takes statistics.
type Vacuum struct {
	Op   int64
	Kind Maintenance
}

// Maintenance is what a Vacuum runs.
type Maintenance int

const (
	// VacuumOnly is VACUUM: dead rows call for it.
	VacuumOnly Maintenance = iota
	// VacuumAnalyze is VACUUM (ANALYZE): dead rows call for it, and the queue
	// outgrew its statistics (OutgrewPlans).
	VacuumAnalyze
	// AnalyzeOnly is ANALYZE: the queue outgrew its statistics, and no dead
	// rows call for a vacuum.
	AnalyzeOnly
)

// Inspected is the result of an Inspect.
type Inspected struct {
	Op         int64
	Dead, Live int64
	// Vacuuming: a vacuum of pepsi.queue is running (autovacuum's, or a DBA's).
	Vacuuming bool
	// Autovacuum: autovacuum is on for the server and not off for the table.
	Autovacuum bool
	// HorizonAge is how long the oldest transaction (or prepared transaction, or
	// replication slot) holding back the xmin horizon has been open, and Horizon
	// says who it is; zero and "" when nothing does.
	HorizonAge time.Duration
	Horizon    string
	// Unrun lists, by stage name, the pending messages of stages the dispatcher
	// does not run (counted up to a bound).
	Unrun []StageCount
	// NotOwner: the dispatcher's role may neither vacuum nor analyze the
	// queue (it is not its owner, nor the database's, nor a superuser, and
	// has no MAINTAIN on it): PostgreSQL would skip either with a warning.
	NotOwner bool
	// Pages is the queue table's size now, in pages; PlannedPages and
	// PlannedRows its size and its rows when its statistics were last taken
	// (by a vacuum or an analyze: pg_class.relpages and reltuples), which the
	// sessions' plans were made for, 0 if never. Pages counts the pages of
	// rows not yet committed, and Live does not: an analyze taken during a
	// long load sets PlannedPages but not PlannedRows, and Live then calls
	// for another.
	Pages, PlannedPages, PlannedRows int64
	Err                              string
}

// Vacuumed is the result of a Vacuum.
type Vacuumed struct {
	Op  int64
	Err string
}

func (Inspect) isCommand() {}
func (Vacuum) isCommand()  {}
func (Inspected) isEvent() {}
func (Vacuumed) isEvent()  {}

func (c Inspect) String() string { return fmt.Sprintf("inspect op=%d", c.Op) }
func (c Vacuum) String() string {
	switch c.Kind {
	case VacuumAnalyze:
		return fmt.Sprintf("vacuum op=%d analyze", c.Op)
	case AnalyzeOnly:
		return fmt.Sprintf("analyze op=%d", c.Op)
	}
	return fmt.Sprintf("vacuum op=%d", c.Op)
}
func (e Inspected) String() string {
	if e.Err != "" {
		return fmt.Sprintf("inspected op=%d err=%q", e.Op, e.Err)
	}
	s := fmt.Sprintf("inspected op=%d dead=%d live=%d vacuuming=%v autovacuum=%v", e.Op, e.Dead, e.Live, e.Vacuuming, e.Autovacuum)
	if e.Horizon != "" {
		s += fmt.Sprintf(" horizon=%s(%q)", e.HorizonAge, e.Horizon)
	}
	for _, u := range e.Unrun {
		s += fmt.Sprintf(" unrun=%s:%d", u.Stage, u.N)
	}
	if e.NotOwner {
		s += " not-owner"
	}
	if e.Pages > 0 || e.PlannedPages > 0 {
		s += fmt.Sprintf(" pages=%d planned=%d", e.Pages, e.PlannedPages)
	}
	if e.PlannedRows > 0 {
		s += fmt.Sprintf(" planned-rows=%d", e.PlannedRows)
	}
	return s
}
func (e Vacuumed) String() string {
	if e.Err != "" {
		return fmt.Sprintf("vacuumed op=%d err=%q", e.Op, e.Err)
	}
	return fmt.Sprintf("vacuumed op=%d", e.Op)
}

// health is what the core knows of the queue table's health.
type health struct {
	// nextOp numbers Inspect and Vacuum apart from the queue commands: they are
	// not part of the step's transaction.
	nextOp      int64
	inspecting  int64 // the Op of the Inspect outstanding, 0 if none
	vacuuming   int64 // the Op of the Vacuum outstanding, 0 if none
	lastInspect time.Time
	lastVacuum  time.Time
	// settledAtInspect is the core's settled (the newest ingress id its
	// claims reported settled) when the last Inspect was sent; liveAtInspect
	// the live rows the last inspection found.
	settledAtInspect, liveAtInspect int64
	// baselineOwed: the last Inspect went out before any claim had
	// reported how far ingress settled (at start), so settledAtInspect
	// is taken from the first claim that does: growth counts the rows
	// added since the start, not the queue's ids before it.
	baselineOwed, claimSeen bool
	warnedOff               bool // said that autovacuum is off
	warnedOwner             bool // said that the role may not vacuum the queue
	warnedAge               bool // said that the horizon is held back (until it is not)
	failed                  bool // said that an inspect or vacuum failed (until one works)
	// unrunSaid: when each stage nobody runs was last said to have pending
	// messages (said again every POLL_INTERVAL while they wait).
	unrunSaid map[string]time.Time
}

// inspected decides what the queue's health calls for.
func (c *Core) inspected(e Inspected) {
	if e.Op != c.health.inspecting {
		return
	}
	h := &c.health
	h.inspecting = 0
	if e.Err != "" {
		if !h.failed {
			h.failed = true
			c.logf(LevelWarn, "cannot read pepsi.queue's vacuum statistics: %s", e.Err)
		}
		return
	}
	h.failed = false
	for _, u := range e.Unrun {
		if last, ok := h.unrunSaid[u.Stage]; !ok || !c.now.Before(last.Add(c.cfg.PollInterval)) {
			if h.unrunSaid == nil {
				h.unrunSaid = map[string]time.Time{}
			}
			h.unrunSaid[u.Stage] = c.now
			c.logf(LevelWarn, "%d messages are pending at stage %s, which no [stage-%s] of this dispatcher's configuration runs: nothing will claim them",
				u.N, conf.Quote(u.Stage), u.Stage)
		}
	}
	if !e.Autovacuum && !h.warnedOff {
		h.warnedOff = true
		switch {
		case c.cfg.Vacuum && !e.NotOwner:
			c.logf(LevelWarn, "autovacuum is off for pepsi.queue: pepsi-dispatch vacuums it itself when it has %d dead rows (VACUUM = off leaves it to you)", VacuumDeadMin)
		case c.cfg.Vacuum:
			c.logf(LevelWarn, "autovacuum is off for pepsi.queue and this dispatcher's role may not vacuum it: nothing removes its dead rows, and the queue slows down as they pile up (%d now)", e.Dead)
		default:
			c.logf(LevelWarn, "autovacuum is off for pepsi.queue and VACUUM = off: nothing removes its dead rows, and the queue slows down as they pile up (%d now)", e.Dead)
		}
	}
	switch old := e.HorizonAge >= HorizonAgeWarn; {
	case old && !h.warnedAge:
		h.warnedAge = true
		c.logf(LevelWarn, "%s has held back the xmin horizon for %s: no vacuum can remove pepsi.queue's dead rows (%d now) until it ends",
			e.Horizon, e.HorizonAge.Truncate(time.Second), e.Dead)
	case !old:
		h.warnedAge = false
	}
	h.liveAtInspect = e.Live
	c.maintain(e)
}

// maintain sends the vacuum, the analyze or both that inspection e calls for.
func (c *Core) maintain(e Inspected) {
	h := &c.health
	if c.cfg.Vacuum && e.NotOwner && !h.warnedOwner {
		h.warnedOwner = true
		c.logf(LevelWarn, "pepsi-dispatch's role may not vacuum or analyze pepsi.queue (only its owner, the database's owner or a superuser may, or on PostgreSQL 17 a role with MAINTAIN on it): "+
			"nothing of pepsi-dispatch's removes its dead rows or makes its plans again for a backlog; grant it, or set VACUUM = off and leave both to autovacuum or a DBA")
	}
	if !c.cfg.Vacuum || e.NotOwner || h.vacuuming != 0 || e.Vacuuming || c.shutdown != 0 ||
		!h.lastVacuum.IsZero() && c.now.Before(h.lastVacuum.Add(VacuumIntervalMin)) {
		return
	}
	kind := VacuumOnly
	switch outgrew := OutgrewPlans(e); {
	case e.Dead >= VacuumDeadMin && outgrew:
		kind = VacuumAnalyze
	case outgrew:
		kind = AnalyzeOnly
	case e.Dead < VacuumDeadMin:
		return
	}
	h.nextOp++
	h.vacuuming = h.nextOp
	h.lastVacuum = c.now
	if kind != VacuumOnly {
		c.logf(LevelInfo, "pepsi.queue has grown to %d pages and %d rows, from %d and %d when its statistics were taken: analyzing it, so that the dispatcher's plans are made again for its size",
			e.Pages, e.Live, e.PlannedPages, e.PlannedRows)
	}
	c.emit(Vacuum{Op: h.vacuuming, Kind: kind})
}

// OutgrewPlans says whether the queue inspection e found calls for an
// analyze: at AnalyzePagesMin or more, it is more than twice the size in
// pages its statistics were taken at; or at AnalyzeRowsMin or more, it holds
// more than twice their live rows.
func OutgrewPlans(e Inspected) bool {
	pages := e.Pages >= AnalyzePagesMin && e.Pages > 2*max(e.PlannedPages, plannerPagesMin)
	rows := e.Live >= AnalyzeRowsMin && e.Live > 2*e.PlannedRows
	return pages || rows
}

func (c *Core) vacuumed(e Vacuumed) {
	if e.Op != c.health.vacuuming {
		return
	}
	c.health.vacuuming = 0
	if e.Err != "" {
		c.logf(LevelWarn, "pepsi.queue's maintenance failed: %s", e.Err)
	}
}

// inspectDue asks for the queue's health every InspectInterval while running,
// and InspectGrowthInterval after the last time when the claims have since
// reported InspectGrowth rows added, and as many as the queue's live rows then:
// a backlog that came after the plans were made is analyzed for them within a
// second or so, not ten.
func (c *Core) inspectDue() {
	h := &c.health
	if at := c.inspectAt(); at.IsZero() || c.now.Before(at) {
		return
	}
	h.nextOp++
	h.inspecting = h.nextOp
	h.lastInspect = c.now
	h.settledAtInspect = c.settled
	h.baselineOwed = !h.claimSeen
	run := make([]string, len(c.stages))
	for i, st := range c.stages {
		run[i] = st.cfg.Name
	}
	c.emit(Inspect{Op: h.inspecting, Run: run})
}

// claimedSettled notes that a claim reported how far ingress settled: the
// first one sets the growth baseline of an Inspect sent before it.
func (c *Core) claimedSettled() {
	h := &c.health
	h.claimSeen = true
	if h.baselineOwed {
		h.baselineOwed = false
		h.settledAtInspect = c.settled
	}
}

// inspectAt is when the next Inspect is due (zero when none will be).
func (c *Core) inspectAt() time.Time {
	h := &c.health
	if c.shutdown > 0 || h.inspecting != 0 {
		return time.Time{}
	}
	if c.settled-h.settledAtInspect >= max(InspectGrowth, h.liveAtInspect) {
		return h.lastInspect.Add(InspectGrowthInterval)
	}
	return h.lastInspect.Add(InspectInterval)
}
