// Shutdown: stopping and then killing the workers, and the Exit once nothing
// is held or owed.

package core

func (c *Core) beginShutdown() {
	switch c.shutdown {
	case 0:
		c.shutdown = 1
		c.shutdownFlushed = !c.hasDeltas() // else the next transaction flushes them (flushDue)
		c.logf(LevelInfo, "shutting down: stopping %d workers", len(c.workers))
		for _, id := range c.workerIDs() {
			w := c.workers[id]
			if w.state == starting || w.state == ready {
				c.stop(w)
			}
		}
		for _, st := range c.stages {
			c.requeue(st, st.backlog)
			st.backlog = nil
		}
	case 1:
		c.shutdown = 2
		c.logf(LevelWarn, "second shutdown request: killing %d workers and exiting now", len(c.workers))
		for _, id := range c.workerIDs() {
			w := c.workers[id]
			if w.state != killed {
				w.state = killed
				w.cause = killNow
				c.emit(Kill{Worker: w.id})
			}
		}
	}
}

// finish ends a shutdown once every worker is gone and every write is made (or, on
// the second request, as soon as every worker is gone).
func (c *Core) finish() {
	if c.shutdown == 0 || len(c.workers) > 0 {
		return
	}
	// needReset: a claim whose result was lost may have left rows running that no
	// one holds; Exit 0 promises every row was reset or resolved.
	if c.shutdown == 1 && (len(c.txns) > 0 || len(c.owed) > 0 || len(c.resendFlushes) > 0 || c.hasDeltas() || c.needReset) {
		if c.dbDown && !c.waitLogged {
			c.waitLogged = true
			c.logf(LevelWarn, "waiting for the database to write %d results; signal again to exit now (the next start-up resets what is left)", len(c.owed))
		}
		return
	}
	code := 0
	if len(c.owed) > 0 || len(c.txns) > 0 || len(c.resendFlushes) > 0 || c.hasDeltas() || c.needReset {
		code = 1
		c.logf(LevelWarn, "exiting with %d results unwritten; the next start-up resets their rows to pending", len(c.owed))
	}
	c.emit(SetTimer{})
	c.emit(Exit{Code: code})
	c.exited = true
}
