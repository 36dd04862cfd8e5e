-- PEPSI schema, version 24: a release that makes a key's head pending after
-- it waited out a retry (attempts > 0) takes the retry's reason out of
-- state.dispatch_error, as the wake does (wakeSQL). A message waiting out a
-- 75 retry waits blocked when an operator retries an older message of its
-- key; when that one finishes, the release, not the wake, ends the younger
-- one's wait, and left the reason in place: a message that then succeeded,
-- or failed for another reason, showed the old retry's reason. A head made
-- paused (its retry not yet due) keeps it: the wake clears it later. Nothing
-- else changes.
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
