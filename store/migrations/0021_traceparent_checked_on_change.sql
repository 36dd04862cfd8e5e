-- PEPSI schema, version 21: a traceparent is checked when it is written, not
-- at every update of its row.
--
-- Schema 17 checked pepsi.queue.traceparent with a CHECK constraint, and
-- PostgreSQL evaluates every CHECK of a table at every UPDATE of a row,
-- whichever columns change: its regular expression cost about 5 µs per row
-- version, at every hop of every message, tracing on or off. A message's
-- traceparent is written once (by its producer, or by its first claim) and
-- then only read, so these triggers check it when an INSERT gives one or an
-- UPDATE changes it, with the same rule and the same error (SQLSTATE 23514,
-- check_violation, naming queue_traceparent_check). The WHEN clauses run in
-- the executor without calling the function, so a claim that keeps a row's
-- traceparent costs a comparison.
ALTER TABLE pepsi.queue DROP CONSTRAINT IF EXISTS queue_traceparent_check;

CREATE OR REPLACE FUNCTION pepsi.check_traceparent() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.traceparent !~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN
        RAISE EXCEPTION 'new row for relation "queue" violates check constraint "queue_traceparent_check"'
            USING ERRCODE = 'check_violation', TABLE = 'queue', SCHEMA = 'pepsi',
                  CONSTRAINT = 'queue_traceparent_check',
                  DETAIL = 'traceparent ' || quote_literal(left(NEW.traceparent, 80)) ||
                           ' is not 00-<32 hex>-<16 hex>-<2 hex> in lower case (W3C Trace Context)';
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS queue_traceparent_insert ON pepsi.queue;
CREATE TRIGGER queue_traceparent_insert BEFORE INSERT ON pepsi.queue
    FOR EACH ROW WHEN (NEW.traceparent IS NOT NULL)
    EXECUTE FUNCTION pepsi.check_traceparent();

DROP TRIGGER IF EXISTS queue_traceparent_update ON pepsi.queue;
CREATE TRIGGER queue_traceparent_update BEFORE UPDATE OF traceparent ON pepsi.queue
    FOR EACH ROW WHEN (NEW.traceparent IS NOT NULL AND NEW.traceparent IS DISTINCT FROM OLD.traceparent)
    EXECUTE FUNCTION pepsi.check_traceparent();
