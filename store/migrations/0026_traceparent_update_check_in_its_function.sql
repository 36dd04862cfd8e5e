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
-- pepsi.traceparent_ok is declared STABLE, not IMMUTABLE STRICT, which is
-- what kept PostgreSQL from inlining it: a function may be inlined only
-- where its body is no more volatile than it says (textsend is STABLE), and
-- a strict one only where its body is strict too (an AND is not). Inlined,
-- PL/pgSQL plans its body once per session in check_traceparent; called,
-- it ran through the SQL function executor, which parses and plans the body
-- again in every transaction. Its answer is the same for every input: NULL
-- for NULL (each comparison of the body is NULL then, and so is their AND).
CREATE OR REPLACE FUNCTION pepsi.traceparent_ok(tp text) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT octet_length(tp) = 55 AND left(tp, 3) = '00-'
       AND get_byte(textsend(tp), 35) = 45 AND get_byte(textsend(tp), 52) = 45
       AND octet_length(replace(tp, '-', '')) = 52
       AND btrim(textsend(tp), '\x2d30313233343536373839616263646566'::bytea) = ''::bytea
$$;

DROP TRIGGER IF EXISTS queue_traceparent_update ON pepsi.queue;
CREATE TRIGGER queue_traceparent_update BEFORE UPDATE OF traceparent ON pepsi.queue
    FOR EACH ROW WHEN (NEW.traceparent IS DISTINCT FROM OLD.traceparent AND NEW.traceparent IS NOT NULL)
    EXECUTE FUNCTION pepsi.check_traceparent();

-- pepsi.refuse_traceparent, the update trigger's function until now, stays:
-- no migration takes away a function an earlier schema made (a dispatcher
-- built for an older schema may still be running; docs/operations.md,
-- "Upgrading").
