-- PEPSI schema, version 36: the order-key trigger refuses to decide a
-- keyed message's status in a transaction that sees the queue through an
-- old snapshot (REPEATABLE READ or SERIALIZABLE).
--
-- The trigger takes the key's lock, then asks whether the key has an
-- unfinished message. At READ COMMITTED each of its queries sees what was
-- committed before it, so the answer holds: whoever held the lock before
-- (the release that finished the key's head, another producer) has
-- committed and is seen. At REPEATABLE READ and SERIALIZABLE the queries
-- see the transaction's snapshot, taken at its first statement, before the
-- lock: a head finished and released after it still looked unfinished, and
-- the new message was inserted blocked behind a message that had left,
-- where no release would ever come for it (its key stuck, and every later
-- message of the key behind it, until the dispatcher's next start).
-- pepsi-queue enqueue on a database whose default_transaction_isolation
-- was repeatable read left a key stuck after 4 of 150 messages. Such an
-- insert of a pending or paused keyed row is now an error (0A000) that says
-- so: nothing of the transaction is inserted, and it may be run again at
-- READ COMMITTED. (READ UNCOMMITTED is READ COMMITTED in PostgreSQL.) Rows
-- inserted finished are not asked about, as before.
CREATE OR REPLACE FUNCTION pepsi.order_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IN ('pending', 'paused')
       AND current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'pepsi.queue: a message with an order_key is inserted at READ COMMITTED only, not at %',
            upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'This transaction''s snapshot may show the key''s head unfinished after it finished, and block the message for good: '
                         'SET TRANSACTION ISOLATION LEVEL READ COMMITTED (docs/protocol.md, "Ordering per key").';
    END IF;
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
