-- PEPSI schema, version 23: the insert trigger that checks a producer's
-- traceparent calls pepsi.traceparent_ok inside its function, not in its
-- WHEN clause.
--
-- PostgreSQL prepares a trigger's WHEN clause anew for every statement that
-- fires the trigger, and preparing it inlines the SQL function
-- pepsi.traceparent_ok: it parses and analyses the function's body each time.
-- With schema 21's WHEN that was most of the cost of the project's triggers
-- for a producer that inserts one row per statement: single-row INSERTs ran
-- at 0.74x the rate without triggers, 0.90x without this one
-- (docs/performance.md, "Ingest"). The WHEN clause is now only
-- "NEW.traceparent IS NOT NULL", which costs nothing to prepare, and the
-- function, whose plan PL/pgSQL keeps for the session, checks the value and
-- refuses it with the same error as before (SQLSTATE 23514, constraint
-- queue_traceparent_check). An insert without a traceparent never calls it.
--
-- The update trigger keeps its WHEN clause: only statements that set
-- traceparent prepare it (the dispatcher's claim and resolve, a few hundred
-- rows each).
CREATE FUNCTION pepsi.check_traceparent() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pepsi.traceparent_ok(NEW.traceparent) THEN
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
