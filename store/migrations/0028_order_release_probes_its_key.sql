-- PEPSI schema, version 28: pepsi.order_release probes its key's entries in
-- the order-key indexes, whatever the statistics say.
--
--   Whether a message of the key runs elsewhere: one probe of
--     queue_order_live above the key's head. Schema 12 asked for any running
--     message of the key but the head, which PostgreSQL answered by reading
--     queue_running (the running rows of every key) and filtering it by key:
--     with 1,000 keys of 100 messages each, 156 µs per key released and 40 %
--     of the server's time in the dispatcher's transactions
--     (docs/performance.md, "A release that read every running row").
--   The key's head: each branch matches the key as a range, ordered as the
--     index is, so that no generic plan walks the primary key from the
--     queue's oldest row instead.
--
-- The function is otherwise schema 27's.
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
        -- The key is matched as a range and the rows ordered by (order_key,
        -- ingress_id), the order-key indexes' own order: matched by equality,
        -- PostgreSQL treats the key as a constant, sees that the primary key
        -- also yields ingress_id order, and with statistics that count many
        -- blocked messages a key prefers walking it from the queue's oldest
        -- row, filtering by key (every finished row before the head, at
        -- every release).
        SELECT q.ingress_id, q.stage, q.status, q.timeout INTO head FROM (
            (SELECT q1.ingress_id, q1.stage, q1.status, q1.timeout FROM pepsi.queue q1
             WHERE q1.order_key >= k AND q1.order_key <= k AND q1.status IN ('pending', 'running', 'paused')
             ORDER BY q1.order_key, q1.ingress_id LIMIT 1)
            UNION ALL
            (SELECT q2.ingress_id, q2.stage, q2.status, q2.timeout FROM pepsi.queue q2
             WHERE q2.order_key >= k AND q2.order_key <= k AND q2.status = 'blocked'
             ORDER BY q2.order_key, q2.ingress_id LIMIT 1)
        ) q ORDER BY q.ingress_id LIMIT 1;
        IF NOT FOUND THEN
            CONTINUE;
        END IF;
        -- A message of the key that runs elsewhere (an operator retried an
        -- older one while a worker held it) is younger than the head, the
        -- key's oldest unfinished message: one probe of queue_order_live
        -- from the head up, where a key has no entry as a rule. Spelled so
        -- ("IS TRUE" hides the status from queue_running's predicate), it
        -- cannot read queue_running instead: the running rows of every key,
        -- filtered by key.
        held := EXISTS (SELECT 1 FROM pepsi.queue q WHERE q.order_key = k
                        AND q.status IN ('pending', 'running', 'paused')
                        AND q.ingress_id > head.ingress_id
                        AND (q.status = 'running') IS TRUE);
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
