-- PEPSI schema, version 16: pepsi.history, what happened to every message,
-- one row per event (a pass's outcome, a wake, a reset, an operator's retry),
-- written in the transaction that makes the event happen.
--
-- Partitioned by day (UTC) on "at", with PostgreSQL's own declarative range
-- partitioning: rows older than HISTORY_KEEP go with their day's partition
-- (DROP TABLE: no bulk DELETE, no dead rows, no vacuum), and a look-up of one
-- message probes each day's small index. There is deliberately no DEFAULT
-- partition: a row that found no day would fall into it, and a default
-- partition holding rows of a day blocks making that day's partition, so
-- retention would silently stop. Instead pepsi.history_day makes a day's
-- partition on demand: the dispatcher makes the days ahead of its clock
-- before it writes (pepsi.history_keep, first in the transaction that
-- writes), and pepsi-queue makes today's before it writes a retried row.
-- pg_partman is not needed (nor on every server).
CREATE SEQUENCE pepsi.history_seq;

CREATE TABLE pepsi.history (
    ingress_id bigint NOT NULL,
    stage      text NOT NULL,
    event      text NOT NULL,
    detail     text NOT NULL DEFAULT '',
    handed_at  timestamptz,
    at         timestamptz NOT NULL,
    worker_pid integer,
    attempts   integer NOT NULL DEFAULT 0,
    -- seq orders the rows of one instant.
    seq        bigint NOT NULL DEFAULT nextval('pepsi.history_seq')
) PARTITION BY RANGE (at);

CREATE INDEX history_message ON pepsi.history (ingress_id, at);

-- pepsi.history_day makes the partition of one UTC day,
-- pepsi.history_YYYYMMDD, unless it is there, and says whether it is there
-- after. Made as a plain table, then attached: ATTACH PARTITION takes only a
-- SHARE UPDATE EXCLUSIVE lock on pepsi.history, so readers and writers of the
-- table go on meanwhile. With wait false it waits at most 50 ms for a lock and
-- then gives up (false). An advisory lock keeps two makers of a day apart.
CREATE FUNCTION pepsi.history_day(day date, wait boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    name text := 'history_' || to_char(day, 'YYYYMMDD');
    old text := current_setting('lock_timeout');
BEGIN
    IF to_regclass('pepsi.' || name) IS NOT NULL THEN
        RETURN true;
    END IF;
    BEGIN
        IF NOT wait THEN
            PERFORM set_config('lock_timeout', '50ms', true);
        END IF;
        PERFORM pg_advisory_xact_lock(1885696104, (day - date '2000-01-01'));
        IF to_regclass('pepsi.' || name) IS NULL THEN
            EXECUTE format('CREATE TABLE pepsi.%I (LIKE pepsi.history)', name);
            EXECUTE format('ALTER TABLE pepsi.history ATTACH PARTITION pepsi.%I FOR VALUES FROM (%L) TO (%L)',
                name, day::timestamp AT TIME ZONE 'UTC', (day + 1)::timestamp AT TIME ZONE 'UTC');
        END IF;
        PERFORM set_config('lock_timeout', old, true);
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END;
    RETURN true;
END
$$;

-- pepsi.history_keep is the dispatcher's upkeep (core.KeepHistory): it makes
-- the days from from_ts to now_ts, waiting for locks if it must, then the days
-- after now_ts up to through_ts without waiting, stopping at the first it
-- cannot make, and drops every partition whose day ends at or before
-- drop_before, skipping one whose lock is held (the next upkeep takes it).
-- It returns where the days made, contiguous from from_ts's, end.
CREATE FUNCTION pepsi.history_keep(from_ts timestamptz, now_ts timestamptz, through_ts timestamptz, drop_before timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    d date;
    covered date := (now_ts AT TIME ZONE 'UTC')::date + 1;
    p record;
    old text := current_setting('lock_timeout');
BEGIN
    FOR d IN SELECT g::date FROM generate_series((from_ts AT TIME ZONE 'UTC')::date, (now_ts AT TIME ZONE 'UTC')::date, interval '1 day') g LOOP
        PERFORM pepsi.history_day(d, true);
    END LOOP;
    FOR d IN SELECT g::date FROM generate_series(covered, (through_ts AT TIME ZONE 'UTC')::date, interval '1 day') g LOOP
        EXIT WHEN NOT pepsi.history_day(d, false);
        covered := d + 1;
    END LOOP;
    FOR p IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'pepsi.history'::regclass AND c.relname ~ '^history_[0-9]{8}$'
               AND (to_date(substr(c.relname, 9), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC' <= drop_before
             ORDER BY c.relname LOOP
        BEGIN
            PERFORM set_config('lock_timeout', '50ms', true);
            EXECUTE format('DROP TABLE pepsi.%I', p.relname);
            PERFORM set_config('lock_timeout', old, true);
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END LOOP;
    RETURN covered::timestamp AT TIME ZONE 'UTC';
END
$$;

-- Today and the next three days, so that a tool writing history before any
-- dispatcher ran finds its day (each makes its own anyway).
SELECT pepsi.history_day((now() AT TIME ZONE 'UTC')::date + i, true) FROM generate_series(0, 3) i;

-- pepsi-httpd shows a message's history: an existing pepsi_monitor role is
-- granted it, as version 14 granted order_key.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pepsi_monitor') THEN
        GRANT SELECT ON pepsi.history TO pepsi_monitor;
    END IF;
END
$$;
