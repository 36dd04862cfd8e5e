-- PEPSI schema, version 12: ordering per key. Messages that share an
-- order_key pass the pipeline one at a time, oldest (smallest ingress_id)
-- first. docs/protocol.md, "Ordering per key", states the rule; this is how the
-- queue keeps it:
--
-- Of a key's unfinished messages (pending, running, paused, blocked) only the
-- oldest, its head, is anything but 'blocked'. A blocked row waits behind its
-- key, off the pending index, so the claim never walks it: a key's backlog
-- costs the claim nothing. (One exception lasts while it must: an operator's
-- retry may make an older message unfinished again while a worker holds a
-- younger one; the older one then waits blocked until that pass ends, and the
-- release that follows hands the key to it.)
--
-- Who decides:
--   - a producer's insert, under the key's lock (below): a keyed row whose key
--     has an unfinished message already is inserted 'blocked' (a scheduled
--     one keeps its timeout for when it becomes the head);
--   - the dispatcher, after every pass of a keyed message (and at start-up),
--     calls pepsi.order_release for the keys: it hands each key to its oldest
--     unfinished message if nothing holds it (blocked -> pending, or paused
--     when its timeout is still ahead) and blocks any younger message that is
--     not (pending or paused -> blocked);
--   - pepsi-queue's retry and discard call it for the keys they touch.
--
-- The key's lock is a transaction advisory lock in its own space (class
-- 0x7065706b, "pepk") on one of 1024 buckets of the key's hash, so a
-- transaction holds at most 1024 such locks however many keys it inserts.
-- Producers take it waiting, so two producers of one key are serial; and the
-- row takes its ingress_id only once it holds the lock, so of two messages of
-- one key the one with the smaller id committed first: ingress_id order is
-- commit order within a key, and no older message of a key can appear after a
-- younger one was taken. The dispatcher never waits for it: it only tries the
-- lock, and a key whose lock a producer holds is released again later (a
-- producer in flight may be inserting a row of that key that a release now
-- would not see).
ALTER TABLE pepsi.queue ADD COLUMN IF NOT EXISTS order_key text;

ALTER TABLE pepsi.queue DROP CONSTRAINT IF EXISTS queue_status_check;
ALTER TABLE pepsi.queue ADD CONSTRAINT queue_status_check
    CHECK (status IN ('pending', 'running', 'paused', 'blocked', 'done', 'failed', 'timeout')) NOT VALID;
ALTER TABLE pepsi.queue VALIDATE CONSTRAINT queue_status_check;

-- A key's head, and whether anything of it is held: its unfinished rows that
-- are not blocked (normally one).
CREATE INDEX IF NOT EXISTS queue_order_live ON pepsi.queue (order_key, ingress_id)
    WHERE order_key IS NOT NULL AND status IN ('pending', 'running', 'paused');
-- The messages waiting behind their key, oldest first.
CREATE INDEX IF NOT EXISTS queue_order_blocked ON pepsi.queue (order_key, ingress_id)
    WHERE status = 'blocked';

-- The key's lock: bucket of the key's hash, in the "pepk" class.
CREATE FUNCTION pepsi.order_bucket(k text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT hashtext(k) & 1023 $$;

-- Before each keyed row is inserted: take the key's lock, then the id, then
-- block the row when its key has an unfinished message.
CREATE FUNCTION pepsi.order_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1885696107, pepsi.order_bucket(NEW.order_key));
    NEW.ingress_id := nextval(pg_get_serial_sequence('pepsi.queue', 'ingress_id'));
    IF NEW.status IN ('pending', 'paused') AND (
        EXISTS (SELECT 1 FROM pepsi.queue q WHERE q.order_key = NEW.order_key
                AND q.status IN ('pending', 'running', 'paused'))
        OR EXISTS (SELECT 1 FROM pepsi.queue q WHERE q.order_key = NEW.order_key
                AND q.status = 'blocked')) THEN
        IF NEW.status = 'pending' THEN
            NEW.timeout := NULL;
        END IF;
        NEW.status := 'blocked';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER queue_order_insert BEFORE INSERT ON pepsi.queue
    FOR EACH ROW WHEN (NEW.order_key IS NOT NULL)
    EXECUTE FUNCTION pepsi.order_insert();

-- pepsi.order_release hands each key in keys to its oldest unfinished
-- message, as the header says, and answers a row per key it could not take
-- (busy: its lock is a producer's; only when wait is false) and per message it
-- made the head (status pending or paused, with its stage and timeout).
-- The keys are taken in sorted order, so two callers that wait cannot
-- deadlock on them.
CREATE FUNCTION pepsi.order_release(keys text[], wait boolean)
RETURNS TABLE (order_key text, busy boolean, ingress_id bigint, stage text, status text, timeout timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    k text;
    head record;
    held boolean;
BEGIN
    FOR k IN SELECT DISTINCT u.k FROM unnest(keys) AS u(k) WHERE u.k IS NOT NULL ORDER BY 1 LOOP
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

-- pepsi.order_blocked_keys lists the keys that have blocked messages, each
-- once, by a skip scan of queue_order_blocked (one probe per key, not one per
-- blocked message): the dispatcher releases them all at start-up, since a
-- stage's own commit of a key's last pass may have been followed by a crash
-- before the dispatcher released the key.
CREATE FUNCTION pepsi.order_blocked_keys() RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE k(key) AS (
        (SELECT q.order_key FROM pepsi.queue q WHERE q.status = 'blocked' ORDER BY q.order_key LIMIT 1)
        UNION ALL
        SELECT (SELECT q.order_key FROM pepsi.queue q
                WHERE q.status = 'blocked' AND q.order_key > k.key ORDER BY q.order_key LIMIT 1)
        FROM k WHERE k.key IS NOT NULL
    )
    SELECT key FROM k WHERE key IS NOT NULL
$$;
