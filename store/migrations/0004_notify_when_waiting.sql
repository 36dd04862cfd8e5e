-- PEPSI schema, version 4: producers notify ingress only while the dispatcher
-- waits for work. NOTIFY serialises committing transactions (a database-wide
-- lock held across the commit), so notifying every single-row insert caps the
-- ingest rate. The trigger now tries to take the gate, advisory lock
-- 0x7065707367617465 ("pepsgate", pgqueue.GateKey), shared for the rest of its
-- transaction:
--   - it gets it: the dispatcher is busy, and will look again before it waits
--     (to wait it takes the gate exclusively, which waits for this transaction
--     to end, and then claims once more); no NOTIFY.
--   - it does not: the dispatcher holds the gate, or is asking for it; NOTIFY.
-- The lock is not MVCC state, so this holds at any isolation level. Nothing
-- changes for producers: a plain INSERT, COPY or pepsi-queue enqueue fires it.
-- The argument: docs/durability.md, "Notifications only when the dispatcher
-- waits". A pepsi-dispatch older than this schema never takes the gate, so its
-- producers would never notify: upgrade the dispatcher with the schema.
CREATE OR REPLACE FUNCTION pepsi.notify_ingress() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared(8099003145853695077) THEN
        PERFORM pg_notify('ingress', '');
    END IF;
    RETURN NULL;
END
$$;
