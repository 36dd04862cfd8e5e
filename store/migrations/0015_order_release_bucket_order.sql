-- PEPSI schema, version 15: pepsi.order_release takes its keys' locks in the
-- order producers take theirs, by bucket (pepsi.order_bucket), then by key.
-- Schema 12 took them in the keys' text order: a release that waits (an
-- operator's tool, wait = true) and a producer inserting several keys, which
-- takes their locks bucket by bucket, could each hold a lock the other waits
-- for, and PostgreSQL would abort one of them (deadlock detected). The
-- dispatcher's releases never wait (they only try each lock), so they were
-- never part of such a cycle. Nothing else changes.
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
        SELECT q.ingress_id, q.status INTO head FROM (
            (SELECT q1.ingress_id, q1.status FROM pepsi.queue q1
             WHERE q1.order_key = k AND q1.status IN ('pending', 'running', 'paused')
             ORDER BY q1.ingress_id LIMIT 1)
            UNION ALL
            (SELECT q2.ingress_id, q2.status FROM pepsi.queue q2
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
        IF head.status = 'blocked' AND NOT held THEN
            RETURN QUERY
            UPDATE pepsi.queue q SET updated_at = now(),
                   status = CASE WHEN q.timeout > now() THEN 'paused' ELSE 'pending' END
            WHERE q.ingress_id = head.ingress_id AND q.status = 'blocked'
            RETURNING q.order_key, false, q.ingress_id, q.stage, q.status, q.timeout;
        END IF;
    END LOOP;
END
$$;
