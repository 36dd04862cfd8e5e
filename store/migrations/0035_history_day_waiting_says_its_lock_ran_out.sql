-- PEPSI schema, version 35: pepsi.history_day, asked to wait for its locks,
-- lets the caller's own lock_timeout end it with its error.
--
-- Schema 16's history_day caught lock_not_available (55P03) in both of its
-- forms. Without wait that is its own 50 ms bound: it says false, and
-- history_keep stops making the days ahead. With wait it could only have
-- been the caller's lock_timeout, which none had until the dispatcher's
-- queue sessions got one (a little under their transaction's timeout): a
-- day that could not be made in time then read as made, history_keep
-- reported it covered, and the transaction's history rows of that day were
-- refused ("no partition of relation "history" found for row"), an error
-- that names neither the lock nor its holder. Now the waiting form raises
-- the lock timeout, so the upkeep fails with it and is tried again.
CREATE OR REPLACE FUNCTION pepsi.history_day(day date, wait boolean) RETURNS boolean
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
        IF wait THEN
            RAISE;
        END IF;
        RETURN false;
    END;
    RETURN true;
END
$$;
