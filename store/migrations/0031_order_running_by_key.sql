-- PEPSI schema, version 31: a keyed message's hop adds one index entry, not
-- two.
--
-- Every update of a queue row that changes its status is a new row version
-- with an entry in each index whose predicate it meets (no update of the
-- queue can be HOT: status and stage are indexed). Schema 12's
-- queue_order_live held a key's pending, running and paused messages, so
-- each hop of a keyed message (the claim, a move that claims, a requeue)
-- added an entry there, at its key's place in the index, beside the one
-- queue_running or queue_pending gets: about 2 us of the server's time per
-- hop, a sixth of what the keys cost a hop where the server bounds hops/s
-- (docs/performance.md, "A keyed hop's index entries").
--
-- Now queue_order_live holds a key's pending and paused messages, and a
-- running message has its one entry where its kind of hop needs it: a keyed
-- one in queue_order_running (order_key, ingress_id), a message without a
-- key in queue_running (ingress_id) as before, added at the index's end. A
-- keyed claim, and a keyed move that claims, add one entry, not two; a hop
-- without a key costs what it did. "Is a message of key k running" and "the
-- key's oldest running message" are a probe of queue_order_running, as
-- "pending or paused" is of queue_order_live and "blocked" of
-- queue_order_blocked: where schema 30 asked "unfinished" with two probes
-- it now asks with three (the insert trigger, the release), except where a
-- key cannot have a running message the asker does not hold (the claim, a
-- move that claims: docs/protocol.md, "Ordering per key"). What reads every
-- running row (the orphan reset, the monitor's count) reads both indexes.
--
-- Upgrading: the three indexes are built anew, each a read of the whole
-- queue under a lock that holds producers off (docs/operations.md,
-- "Upgrading").
DROP INDEX IF EXISTS pepsi.queue_running;
CREATE INDEX queue_running ON pepsi.queue (ingress_id) WHERE status = 'running' AND order_key IS NULL;
CREATE INDEX IF NOT EXISTS queue_order_running ON pepsi.queue (order_key, ingress_id)
    WHERE status = 'running' AND order_key IS NOT NULL;
DROP INDEX IF EXISTS pepsi.queue_order_live;
CREATE INDEX queue_order_live ON pepsi.queue (order_key, ingress_id)
    WHERE order_key IS NOT NULL AND status IN ('pending', 'paused');

-- Schema 30's trigger, its probe of live messages split in two.
CREATE OR REPLACE FUNCTION pepsi.order_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1885696107, pepsi.order_bucket(NEW.order_key));
    NEW.ingress_id := nextval(pg_get_serial_sequence('pepsi.queue', 'ingress_id'));
    IF NEW.status IN ('pending', 'paused') AND (
        (SELECT q.ingress_id FROM pepsi.queue q
         WHERE q.order_key >= NEW.order_key AND q.order_key <= NEW.order_key
           AND q.status IN ('pending', 'paused')
         ORDER BY q.order_key, q.ingress_id LIMIT 1) IS NOT NULL
        OR (SELECT q.ingress_id FROM pepsi.queue q
            WHERE q.order_key >= NEW.order_key AND q.order_key <= NEW.order_key
              AND q.status = 'running'
            ORDER BY q.order_key, q.ingress_id LIMIT 1) IS NOT NULL
        OR (SELECT q.ingress_id FROM pepsi.queue q
            WHERE q.order_key >= NEW.order_key AND q.order_key <= NEW.order_key
              AND q.status = 'blocked'
            ORDER BY q.order_key, q.ingress_id LIMIT 1) IS NOT NULL) THEN
        IF NEW.status = 'pending' THEN
            NEW.timeout := NULL;
        END IF;
        NEW.status := 'blocked';
    END IF;
    RETURN NEW;
END
$$ SET enable_sort = off;

-- Schema 29's release, its head found in three indexes and its probe for a
-- held message in queue_running.
CREATE OR REPLACE FUNCTION pepsi.order_release(keys text[], wait boolean)
RETURNS TABLE (order_key text, busy boolean, ingress_id bigint, stage text, status text, timeout timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    mine text[];
    taken text[];
BEGIN
    -- Most of the dispatcher's releases pass no key (releaseSQL leaves out
    -- the keys that need nothing): they start no statement at all.
    IF coalesce(cardinality(keys), 0) = 0 THEN
        RETURN;
    END IF;
    -- The subquery's OFFSET 0 keeps its order, and its caller's lock calls
    -- (a volatile target list is never pulled up) run once a key, in it.
    IF wait THEN
        SELECT coalesce(array_agg(l.k), '{}'), '{}' INTO mine, taken FROM (
            SELECT o.k, pg_advisory_xact_lock(1885696107, o.b) FROM (
                SELECT DISTINCT u.k, pepsi.order_bucket(u.k) AS b FROM unnest(keys) AS u(k)
                WHERE u.k IS NOT NULL ORDER BY 2, 1 OFFSET 0) o) l;
    ELSE
        SELECT coalesce(array_agg(l.k) FILTER (WHERE l.got), '{}'),
               coalesce(array_agg(l.k) FILTER (WHERE NOT l.got), '{}') INTO mine, taken FROM (
            SELECT o.k, pg_try_advisory_xact_lock(1885696107, o.b) AS got FROM (
                SELECT DISTINCT u.k, pepsi.order_bucket(u.k) AS b FROM unnest(keys) AS u(k)
                WHERE u.k IS NOT NULL ORDER BY 2, 1 OFFSET 0) o) l;
    END IF;
    IF cardinality(mine) = 0 THEN
        RETURN QUERY SELECT t.k, true, NULL::bigint, NULL::text, NULL::text, NULL::timestamptz FROM unnest(taken) AS t(k);
        RETURN;
    END IF;
    RETURN QUERY
    WITH head AS (
        -- Each key's head, its oldest unfinished message (the first entry of
        -- the key in any of the three order-key indexes): the key is matched
        -- as a range and the rows ordered as the order-key indexes are, so
        -- that no plan walks the primary key from the queue's oldest row
        -- instead (schema 28).
        SELECT m.k, h.ingress_id AS id, h.stage, h.status, h.timeout, x.held,
               -- Every message of the key that is neither the head nor held
               -- waits blocked (normally there is none).
               ARRAY(SELECT o.ingress_id FROM pepsi.queue o
                     WHERE o.order_key = m.k AND o.status IN ('pending', 'paused')
                       AND (o.ingress_id <> h.ingress_id OR x.held)) AS others
        FROM unnest(mine) AS m(k)
        CROSS JOIN LATERAL (
            SELECT q.ingress_id, q.stage, q.status, q.timeout FROM (
                (SELECT q1.ingress_id, q1.stage, q1.status, q1.timeout FROM pepsi.queue q1
                 WHERE q1.order_key >= m.k AND q1.order_key <= m.k AND q1.status IN ('pending', 'paused')
                 ORDER BY q1.order_key, q1.ingress_id LIMIT 1)
                UNION ALL
                (SELECT q3.ingress_id, q3.stage, q3.status, q3.timeout FROM pepsi.queue q3
                 WHERE q3.order_key >= m.k AND q3.order_key <= m.k AND q3.status = 'running'
                 ORDER BY q3.order_key, q3.ingress_id LIMIT 1)
                UNION ALL
                (SELECT q2.ingress_id, q2.stage, q2.status, q2.timeout FROM pepsi.queue q2
                 WHERE q2.order_key >= m.k AND q2.order_key <= m.k AND q2.status = 'blocked'
                 ORDER BY q2.order_key, q2.ingress_id LIMIT 1)
            ) q ORDER BY q.ingress_id LIMIT 1) h
        -- A message of the key that runs elsewhere (an operator retried an
        -- older one while a worker held it) is younger than the head: one
        -- probe of the key's entries in queue_order_running above the
        -- head. OFFSET 0 keeps the subquery whole: pulled up, its probe would
        -- be planned, and run, again inside "others".
        CROSS JOIN LATERAL (
            SELECT EXISTS (SELECT 1 FROM pepsi.queue r WHERE r.order_key >= m.k AND r.order_key <= m.k
                           AND r.status = 'running' AND r.ingress_id > h.ingress_id
                           ORDER BY r.order_key, r.ingress_id LIMIT 1 OFFSET 0) AS held OFFSET 0) x
    ),
    -- Both updates find their rows by id. Their statuses are spelled "IS
    -- TRUE", so that they imply no partial index's predicate: spelled
    -- "status = 'blocked'", a generic plan made while the queue had few
    -- blocked rows read the whole of queue_order_blocked, and the heap row
    -- of every blocked message, once a backlog had come (a review found
    -- 201,063 buffers and 82 ms to release one key beside 199,000 blocked
    -- messages; TestReleasePromotesItsHeadsByIDNotThroughEveryBlockedRow).
    blocked AS (
        UPDATE pepsi.queue q SET status = 'blocked', updated_at = now(),
               timeout = CASE WHEN q.status = 'paused' THEN q.timeout END
        WHERE q.ingress_id = ANY (ARRAY(SELECT unnest(h.others) FROM head h))
          AND (q.status IN ('pending', 'paused')) IS TRUE
    ), promoted AS (
        UPDATE pepsi.queue q SET updated_at = now(),
               status = CASE WHEN q.timeout > now() THEN 'paused' ELSE 'pending' END,
               ready_at = CASE WHEN q.timeout > now() THEN q.ready_at ELSE now() END,
               state = CASE WHEN q.timeout > now() OR q.attempts = 0 OR jsonb_typeof(q.state) <> 'object' THEN q.state
                            ELSE q.state - 'dispatch_error' END
        WHERE q.ingress_id = ANY (ARRAY(SELECT h.id FROM head h WHERE NOT h.held AND h.status = 'blocked'))
          AND (q.status = 'blocked') IS TRUE
        RETURNING q.order_key, false, q.ingress_id, q.stage, q.status, q.timeout
    )
    SELECT t.k, true, NULL::bigint, NULL::text, NULL::text, NULL::timestamptz FROM unnest(taken) AS t(k)
    UNION ALL
    SELECT * FROM promoted
    UNION ALL
    SELECT h.k, false, h.id, h.stage, h.status, h.timeout FROM head h
    WHERE NOT h.held AND h.status IN ('pending', 'paused');
END
$$;
