-- PEPSI schema, version 34: a message paused for good (paused, no
-- timeout: never due, it stays paused until someone sets its timeout) that
-- is blocked behind its key keeps its pause, as 'infinity'.
--
-- A blocked row keeps the timeout of the pause it had, and its release
-- makes it paused again while that timeout is ahead, else pending. A row
-- blocked from pending has none, so a pause for good, whose timeout is
-- NULL too, came back pending when its key was handed back to it (after an
-- operator retried an older message of its key, say), and ran. Blocking a
-- paused row (pepsi.order_release, and the insert trigger for a row
-- inserted paused) now keeps a NULL timeout as 'infinity', which is never
-- due either, so its release makes it paused, for good, again. Everything
-- else is schema 33's and schema 30's, unchanged.
CREATE OR REPLACE FUNCTION pepsi.order_release(keys text[], wait boolean)
RETURNS TABLE (order_key text, busy boolean, ingress_id bigint, stage text, status text, timeout timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    mine text[];
    taken text[];
    out_row record;
    woke bigint[] := '{}';
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
    FOR out_row IN
    WITH head AS (
        -- Each key's head, its oldest unfinished message: the key is matched
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
                 WHERE q1.order_key >= m.k AND q1.order_key <= m.k AND q1.status IN ('pending', 'running', 'paused')
                 ORDER BY q1.order_key, q1.ingress_id LIMIT 1)
                UNION ALL
                (SELECT q2.ingress_id, q2.stage, q2.status, q2.timeout FROM pepsi.queue q2
                 WHERE q2.order_key >= m.k AND q2.order_key <= m.k AND q2.status = 'blocked'
                 ORDER BY q2.order_key, q2.ingress_id LIMIT 1)
            ) q ORDER BY q.ingress_id LIMIT 1) h
        -- A message of the key that runs elsewhere (an operator retried an
        -- older one while a worker held it) is younger than the head: one
        -- probe of queue_order_live from the head up. "IS TRUE" hides the
        -- status from queue_running's predicate (schema 28). OFFSET 0 keeps
        -- the subquery whole: pulled up, its probe would be planned, and
        -- run, again inside "others".
        CROSS JOIN LATERAL (
            SELECT EXISTS (SELECT 1 FROM pepsi.queue r WHERE r.order_key = m.k
                           AND r.status IN ('pending', 'running', 'paused')
                           AND r.ingress_id > h.ingress_id
                           AND (r.status = 'running') IS TRUE) AS held OFFSET 0) x
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
               timeout = CASE WHEN q.status = 'paused' THEN coalesce(q.timeout, 'infinity') END
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
        RETURNING q.order_key, q.ingress_id, q.stage, q.status, q.timeout, q.attempts
    )
    SELECT t.k, true AS b, NULL::bigint AS id, NULL::text AS st, NULL::text AS s, NULL::timestamptz AS tmo, false AS woke
    FROM unnest(taken) AS t(k)
    UNION ALL
    SELECT p.order_key, false, p.ingress_id, p.stage, p.status, p.timeout, p.status = 'pending' AND p.timeout IS NOT NULL
    FROM promoted p
    UNION ALL
    SELECT h.k, false, h.id, h.stage, h.status, h.timeout, false FROM head h
    WHERE NOT h.held AND h.status IN ('pending', 'paused')
    LOOP
        order_key := out_row.k; busy := out_row.b; ingress_id := out_row.id; stage := out_row.st; status := out_row.s; timeout := out_row.tmo;
        RETURN NEXT;
        IF out_row.woke THEN
            woke := woke || out_row.id;
        END IF;
    END LOOP;
    -- A promoted message whose pause, retry wait or schedule ran out while
    -- it waited blocked is woken here, as the dispatcher's wake records it
    -- (any stage's, as there). In a statement of its own, run only when
    -- there is such a row, by a role that may insert into pepsi.history,
    -- and into a partition that exists (the dispatcher makes days ahead; a
    -- tool makes today's before it writes): a release never fails for a
    -- history row, and a tool's role needs no privilege on pepsi.history to
    -- release keys (PostgreSQL checks a statement's privileges when it
    -- starts, whether it writes a row or not).
    IF cardinality(woke) > 0 AND has_table_privilege('pepsi.history', 'INSERT')
       AND to_regclass('pepsi.history_' || to_char((now() AT TIME ZONE 'UTC')::date, 'YYYYMMDD')) IS NOT NULL THEN
        INSERT INTO pepsi.history (ingress_id, stage, event, at, attempts)
        SELECT q.ingress_id, q.stage, 'woken', now(), q.attempts FROM pepsi.queue q WHERE q.ingress_id = ANY (woke);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pepsi.order_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1885696107, pepsi.order_bucket(NEW.order_key));
    NEW.ingress_id := nextval(pg_get_serial_sequence('pepsi.queue', 'ingress_id'));
    IF NEW.status IN ('pending', 'paused') AND (
        (SELECT q.ingress_id FROM pepsi.queue q
         WHERE q.order_key >= NEW.order_key AND q.order_key <= NEW.order_key
           AND q.status IN ('pending', 'running', 'paused')
         ORDER BY q.order_key, q.ingress_id LIMIT 1) IS NOT NULL
        OR (SELECT q.ingress_id FROM pepsi.queue q
            WHERE q.order_key >= NEW.order_key AND q.order_key <= NEW.order_key
              AND q.status = 'blocked'
            ORDER BY q.order_key, q.ingress_id LIMIT 1) IS NOT NULL) THEN
        IF NEW.status = 'pending' THEN
            NEW.timeout := NULL;
        ELSE
            NEW.timeout := coalesce(NEW.timeout, 'infinity');
        END IF;
        NEW.status := 'blocked';
    END IF;
    RETURN NEW;
END
$$ SET enable_sort = off;
