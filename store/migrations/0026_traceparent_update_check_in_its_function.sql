-- PEPSI schema, version 26: the update trigger that checks a traceparent
-- calls pepsi.traceparent_ok inside its function, not in its WHEN clause, as
-- the insert trigger has since schema 23.
--
-- PostgreSQL prepares a trigger's WHEN clause anew for every statement that
-- fires the trigger, and preparing schema 21's clause tried to inline the SQL
-- function pepsi.traceparent_ok (parsing and analysing its body, then giving
-- up: the body is not strict), and evaluating it on a row ran the function's
-- body through the SQL function executor, parsed and planned again. The
-- dispatcher's claim and resolve set traceparent (a fresh one for a message
-- that has none), so both paid it in every step transaction, however few
-- rows they carried: about a sixth of the backend's time in a step of six
-- hops (docs/performance.md, "A transaction's fixed cost"). The WHEN clause
-- is now free to prepare, and the function, whose plan PL/pgSQL keeps for the
-- session, is called only for a row whose traceparent the update changes (a
-- message's first claim, or a writer outside the dispatcher), with the same
-- rule and the same error as before (SQLSTATE 23514, constraint
-- queue_traceparent_check).

-- pepsi.traceparent_ok is declared IMMUTABLE but not STRICT, over a body of
-- immutable functions only, which is what PostgreSQL needs to inline it: a
-- strict function is inlined only where its body is strict too (an AND is
-- not), and any function only where its body is no more volatile than it
-- says. Schema 21's body used textsend, which is STABLE (it converts the
-- text to the client's encoding: with a LATIN1 client a 55-byte traceparent
-- of non-ASCII letters failed with "index out of range", not the check's
-- error). Inlined, PL/pgSQL plans its body once per session in
-- check_traceparent, and, the expression being immutable, evaluates it
-- without taking a new snapshot for every row; called, it ran through the
-- SQL function executor, which parses and plans the body again in every
-- transaction. The rule is the same: 55 bytes, "00-" first, dashes at the
-- 36th and 53rd characters and nowhere else but the third, every other
-- character a lower-case hex digit (translate leaves nothing of a string
-- made of those only; every such character is one byte, so 55 bytes are 55
-- characters). NULL gives NULL, as before.
CREATE OR REPLACE FUNCTION pepsi.traceparent_ok(tp text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT octet_length(tp) = 55 AND left(tp, 3) = '00-'
       AND substr(tp, 36, 1) = '-' AND substr(tp, 53, 1) = '-'
       AND octet_length(replace(tp, '-', '')) = 52
       AND translate(tp, '-0123456789abcdef', '') = ''
$$;

DROP TRIGGER IF EXISTS queue_traceparent_update ON pepsi.queue;
CREATE TRIGGER queue_traceparent_update BEFORE UPDATE OF traceparent ON pepsi.queue
    FOR EACH ROW WHEN (NEW.traceparent IS DISTINCT FROM OLD.traceparent AND NEW.traceparent IS NOT NULL)
    EXECUTE FUNCTION pepsi.check_traceparent();

-- pepsi.refuse_traceparent, the update trigger's function until now, stays:
-- no migration takes away a function an earlier schema made (a dispatcher
-- built for an older schema may still be running; docs/operations.md,
-- "Upgrading").
