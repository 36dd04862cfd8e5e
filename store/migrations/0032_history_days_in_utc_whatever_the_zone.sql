-- PEPSI schema, version 32: pepsi.history_keep counts its days as dates,
-- whatever the session's time zone.
--
-- Schema 16's loops were generate_series(date, date, interval '1 day'),
-- which PostgreSQL resolves to its timestamptz form: each date became its
-- midnight in the session's time zone, and each step kept the wall-clock
-- time. In a zone whose clocks jump at midnight (America/Santiago on
-- 2026-09-06, America/Asuncion, America/Havana, Asia/Beirut, ...) that
-- midnight does not exist: the step became 01:00 and stayed there, past
-- the range's end at 00:00, so the last day of a range that crossed the
-- jump was not made. The days ahead then ended a day short, and a
-- transaction that resolved a pass answered on the skipped day's eve (from
-- that day, through to now) did not make today: its rows of today were
-- refused ("no partition of relation "history" found for row"), every time
-- the dispatcher sent it again. The series now runs on timestamp without
-- time zone, which has no zone and no jump.
CREATE OR REPLACE FUNCTION pepsi.history_keep(from_ts timestamptz, now_ts timestamptz, through_ts timestamptz, drop_before timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    d date;
    covered date := (now_ts AT TIME ZONE 'UTC')::date + 1;
    p record;
    old text := current_setting('lock_timeout');
BEGIN
    FOR d IN SELECT g::date FROM generate_series((from_ts AT TIME ZONE 'UTC')::date::timestamp, (now_ts AT TIME ZONE 'UTC')::date::timestamp, interval '1 day') g LOOP
        PERFORM pepsi.history_day(d, true);
    END LOOP;
    FOR d IN SELECT g::date FROM generate_series(covered::timestamp, (through_ts AT TIME ZONE 'UTC')::date::timestamp, interval '1 day') g LOOP
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
