-- PEPSI schema, version 27: no row trigger fires on an UPDATE of pepsi.queue.
--
-- Any BEFORE UPDATE row trigger makes PostgreSQL lock each row before it
-- updates it (one more WAL record per row version), and every row trigger,
-- BEFORE or AFTER, deforms the old and the new row to evaluate its WHEN
-- clause. Schemas 11, 13 and 21 each added one, and together they were
-- about a seventh of the server's work per hop of the dispatcher's batched
-- writes (docs/performance.md, "Schema 27: no trigger on a queue update").
-- What each did is now done by the writers, where it costs nothing more:
--
--   queue_attempts_reset (schema 11): attempts is 0 again on every move to
--     another stage. The dispatcher's moves set it (they always did), and so
--     do its requeue of a row its stage advanced itself and pepsi-queue
--     retry. For a row a stage advanced just before a dispatcher died, the
--     new column attempts_stage says where the attempts were counted: the
--     retry that adds one writes it, and the claim and the orphan reset
--     count the attempts as 0 at any other stage (NULL keeps them: a row
--     retried by an older dispatcher still running after this migration).
--   queue_ready_at (schema 13): the dispatcher's writes that make a row
--     ready anew set ready_at = now() (moves and wakes since schema 26's
--     time; now also the requeue of a row its stage advanced, which is when
--     that row becomes ready at its new stage), and so do pepsi-queue retry
--     and pepsi.order_release, below. A row a stage advanced just before a
--     dispatcher died keeps its earlier ready_at through the start-up reset.
--   queue_traceparent_update (schema 21): a traceparent an UPDATE writes is
--     no longer checked by the database. Only the dispatcher writes one (a
--     fresh one, made well-formed); producers' inserts are still checked
--     (queue_traceparent_insert). A malformed value some other UPDATE wrote
--     stays in the row, and PEPSI reads it as none: the message's passes,
--     and its emitted children's, are part of no trace
--     (internal/traceparent.Pass).
--
-- The functions the triggers called stay: no migration takes away a
-- function an earlier schema made.
DROP TRIGGER IF EXISTS queue_attempts_reset ON pepsi.queue;
DROP TRIGGER IF EXISTS queue_ready_at ON pepsi.queue;
DROP TRIGGER IF EXISTS queue_traceparent_update ON pepsi.queue;

ALTER TABLE pepsi.queue ADD COLUMN IF NOT EXISTS attempts_stage text;

-- The unfinished rows retried before this version counted their attempts at
-- the stage they are at (schema 11's trigger set them to 0 at every move
-- until now). Each status is looked up through its own partial index, so
-- this reads the unfinished rows, not the finished ones.
UPDATE pepsi.queue q SET attempts_stage = q.stage
WHERE q.attempts <> 0 AND q.ingress_id IN (
    SELECT ingress_id FROM pepsi.queue WHERE status = 'pending'
    UNION ALL SELECT ingress_id FROM pepsi.queue WHERE status = 'running'
    UNION ALL SELECT ingress_id FROM pepsi.queue WHERE status = 'paused'
    UNION ALL SELECT ingress_id FROM pepsi.queue WHERE status = 'blocked');

-- pepsi.order_release as schema 24 made it, and it sets ready_at where it
-- makes a key's head pending (schema 13's trigger did).
CREATE OR REPLACE FUNCTION pepsi.order_release(keys text[], wait boolean)
RETURNS TABLE (order_key text, busy boolean, ingress_id bigint, stage text, status text, timeout timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    k text;
    head record;
    held boolean;
BEGIN
    FOR k IN SELECT u.k FROM (SELECT DISTINCT u0.k FROM unnest(keys) AS u0(k) WHERE u0.k IS NOT NULL) u
             ORDER BY pepsi.order_bucket(u.k), u.k LOOP
        IF wait THEN
            PERFORM pg_advisory_xact_lock(1885696107, pepsi.order_bucket(k));
        ELSIF NOT pg_try_advisory_xact_lock(1885696107, pepsi.order_bucket(k)) THEN
            order_key := k; busy := true; ingress_id := NULL; stage := NULL; status := NULL; timeout := NULL;
            RETURN NEXT;
            CONTINUE;
        END IF;
        SELECT q.ingress_id, q.stage, q.status, q.timeout INTO head FROM (
            (SELECT q1.ingress_id, q1.stage, q1.status, q1.timeout FROM pepsi.queue q1
             WHERE q1.order_key = k AND q1.status IN ('pending', 'running', 'paused')
             ORDER BY q1.ingress_id LIMIT 1)
            UNION ALL
            (SELECT q2.ingress_id, q2.stage, q2.status, q2.timeout FROM pepsi.queue q2
             WHERE q2.order_key = k AND q2.status = 'blocked'
             ORDER BY q2.ingress_id LIMIT 1)
        ) q ORDER BY q.ingress_id LIMIT 1;
        IF NOT FOUND THEN
            CONTINUE;
        END IF;
        held := EXISTS (SELECT 1 FROM pepsi.queue q WHERE q.order_key = k
                        AND q.status = 'running' AND q.ingress_id <> head.ingress_id);
        -- Every message of the key that is neither the head nor held waits
        -- blocked (normally there is none: this walks only live rows).
        UPDATE pepsi.queue q SET status = 'blocked', updated_at = now(),
               timeout = CASE WHEN q.status = 'paused' THEN q.timeout END
        WHERE q.order_key = k AND q.status IN ('pending', 'paused')
          AND (q.ingress_id <> head.ingress_id OR held);
        IF held THEN
            CONTINUE;
        END IF;
        IF head.status = 'blocked' THEN
            RETURN QUERY
            UPDATE pepsi.queue q SET updated_at = now(),
                   status = CASE WHEN q.timeout > now() THEN 'paused' ELSE 'pending' END,
                   ready_at = CASE WHEN q.timeout > now() THEN q.ready_at ELSE now() END,
                   state = CASE WHEN q.timeout > now() OR q.attempts = 0 OR jsonb_typeof(q.state) <> 'object' THEN q.state
                                ELSE q.state - 'dispatch_error' END
            WHERE q.ingress_id = head.ingress_id AND q.status = 'blocked'
            RETURNING q.order_key, false, q.ingress_id, q.stage, q.status, q.timeout;
        ELSIF head.status IN ('pending', 'paused') THEN
            order_key := k; busy := false; ingress_id := head.ingress_id; stage := head.stage;
            status := head.status; timeout := head.timeout;
            RETURN NEXT;
        END IF;
    END LOOP;
END
$$;
