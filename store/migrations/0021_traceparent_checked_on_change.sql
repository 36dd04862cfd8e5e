-- PEPSI schema, version 21: a traceparent is checked when it is written, not
-- at every update of its row, and without a regular expression.
--
-- Schema 17 checked pepsi.queue.traceparent with a CHECK constraint, and
-- PostgreSQL evaluates every CHECK of a table at every UPDATE of a row,
-- whichever columns change: its regular expression cost about 5 µs per row
-- version, at every hop of every message, tracing on or off. A message's
-- traceparent is written once (by its producer, or by its first claim) and
-- then only read, so these triggers check it when an INSERT gives one or an
-- UPDATE changes it, with the same rule and the same error (SQLSTATE 23514,
-- check_violation, naming queue_traceparent_check). The rule is
-- pepsi.traceparent_ok, evaluated in the triggers' WHEN clauses (the trigger
-- function runs only to refuse), so a claim that keeps a row's traceparent
-- costs a comparison and one that gives a fresh one about a microsecond.
ALTER TABLE pepsi.queue DROP CONSTRAINT IF EXISTS queue_traceparent_check;

-- pepsi.traceparent_ok is true for a W3C traceparent of version 00 in lower
-- case, 00-<32 hex>-<16 hex>-<2 hex>, exactly as the regular expression
-- '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' says, at a sixth of its cost:
-- 55 bytes, each a dash or a lower-case hex digit, exactly three dashes, at
-- bytes 3, 36 and 53 (textsend gives the text's own bytes, whatever
-- backslashes it holds).
CREATE OR REPLACE FUNCTION pepsi.traceparent_ok(tp text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT octet_length(tp) = 55 AND left(tp, 3) = '00-'
       AND get_byte(textsend(tp), 35) = 45 AND get_byte(textsend(tp), 52) = 45
       AND octet_length(replace(tp, '-', '')) = 52
       AND btrim(textsend(tp), '\x2d30313233343536373839616263646566'::bytea) = ''::bytea
$$;

CREATE OR REPLACE FUNCTION pepsi.refuse_traceparent() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'new row for relation "queue" violates check constraint "queue_traceparent_check"'
        USING ERRCODE = 'check_violation', TABLE = 'queue', SCHEMA = 'pepsi',
              CONSTRAINT = 'queue_traceparent_check',
              DETAIL = 'traceparent ' || quote_literal(left(NEW.traceparent, 80)) ||
                       ' is not 00-<32 hex>-<16 hex>-<2 hex> in lower case (W3C Trace Context)';
END
$$;

DROP TRIGGER IF EXISTS queue_traceparent_insert ON pepsi.queue;
CREATE TRIGGER queue_traceparent_insert BEFORE INSERT ON pepsi.queue
    FOR EACH ROW WHEN (NEW.traceparent IS NOT NULL AND NOT pepsi.traceparent_ok(NEW.traceparent))
    EXECUTE FUNCTION pepsi.refuse_traceparent();

DROP TRIGGER IF EXISTS queue_traceparent_update ON pepsi.queue;
CREATE TRIGGER queue_traceparent_update BEFORE UPDATE OF traceparent ON pepsi.queue
    FOR EACH ROW WHEN (NEW.traceparent IS DISTINCT FROM OLD.traceparent AND NEW.traceparent IS NOT NULL
                       AND NOT pepsi.traceparent_ok(NEW.traceparent))
    EXECUTE FUNCTION pepsi.refuse_traceparent();
