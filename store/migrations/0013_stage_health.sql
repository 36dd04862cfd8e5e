-- PEPSI schema, version 13: what a stage's workers are doing, and since when
-- a message is ready.
--
-- stage_health: one row per stage of the dispatcher that holds the lock,
-- written by it whenever its core's verdict on a stage changes (core.Health:
-- ok, cannot_start, crashing, rate_held), read by pepsi-httpd and
-- pepsi-queue stats. since is when the stage entered its state; until, for
-- cannot_start, when its spawn cooldown ends. The rows of a dispatcher that
-- has stopped stay: a reader trusts them only while a dispatcher holds the
-- lock, and the next one replaces them all at its start.
CREATE TABLE pepsi.stage_health (
    stage      text        PRIMARY KEY,
    state      text        NOT NULL,
    reason     text        NOT NULL DEFAULT '',
    until      timestamptz,
    since      timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- ready_at: when the row last became ready to be claimed at its stage:
-- inserted, moved to another stage (by the dispatcher or by a stage's own
-- UPDATE), woken, released by its order key, retried. A claim and the requeue that gives a claimed row
-- back (a worker that could not start, a crash's other messages, the
-- start-up reset) keep it, so the age of the oldest pending message grows
-- while a stage cannot run it, instead of starting again at every failed
-- hand-over. NULL for the rows made before this version: readers take
-- updated_at for them (the column is added without rewriting the table).
ALTER TABLE pepsi.queue ADD COLUMN ready_at timestamptz;
ALTER TABLE pepsi.queue ALTER COLUMN ready_at SET DEFAULT now();

-- The trigger sets ready_at in the updates that make a row ready anew: a
-- row that stays pending or running at another stage (a move, a move that
-- claims), or that becomes pending or running from paused, blocked, failed,
-- timeout or done, unless the update sets ready_at itself. Its WHEN clause is
-- evaluated without calling the function, so a claim, a requeue or a pass to
-- done or failed costs nothing more.
CREATE FUNCTION pepsi.queue_ready_at() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.ready_at := now();
    RETURN NEW;
END
$$;

CREATE TRIGGER queue_ready_at
    BEFORE UPDATE ON pepsi.queue
    FOR EACH ROW
    WHEN (NEW.status IN ('pending', 'running')
          AND (NEW.stage IS DISTINCT FROM OLD.stage OR OLD.status NOT IN ('pending', 'running'))
          AND NEW.ready_at IS NOT DISTINCT FROM OLD.ready_at)
    EXECUTE FUNCTION pepsi.queue_ready_at();

-- pepsi-httpd's role (pepsi-httpd(8), "DATABASE ROLE"), where it exists,
-- reads the new column and table as it reads the rest.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pepsi_monitor') THEN
        GRANT SELECT (ready_at) ON pepsi.queue TO pepsi_monitor;
        GRANT SELECT ON pepsi.stage_health TO pepsi_monitor;
    END IF;
END
$$;
