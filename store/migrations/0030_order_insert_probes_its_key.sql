-- PEPSI schema, version 30: the order-key trigger asks whether a message's
-- key has an unfinished message with probes of the key's own entries in the
-- order-key indexes, whatever the statistics.
--
-- Schema 12's probes, "EXISTS (... order_key = k AND status = 'blocked')"
-- and its twin for live messages, were planned from the statistics alone.
-- Where they say the queue holds few keys and most of its messages are
-- blocked (a few keys with backlogs, analyzed), a plan finds a matching row
-- soonest by reading the table in order, and PostgreSQL took it: for a key
-- with no unfinished message (a new key) every insert then read the whole
-- queue. 20 keys of 200 messages, analyzed: 0.5-1.2 ms an insert, growing
-- with the queue, against 16 us (docs/performance.md, "A producer's insert
-- beside a few keys' backlogs"; TestAKeyedInsertProbesItsKeyWhateverTheStatistics).
--
-- Each probe is now a look-up of the key's first entry in its index's
-- order: the key matched as a range and the rows ordered by (order_key,
-- ingress_id), as schema 28 finds a key's head. Only the order-key indexes
-- give that order, so a plan that read the table would have to sort what it
-- read, and none walks the primary key instead. The function runs with
-- enable_sort off, so that even a plan made while the queue was a few pages
-- (analyzed nearly empty, where reading and sorting it all looks cheapest)
-- probes the index: PL/pgSQL keeps a session's plan until the table's
-- statistics change, and such a plan read the whole queue at every insert
-- of the statement or session that made it (5,000 inserts of 20 keys into
-- a queue analyzed empty: 1.4 s, against 81 ms with it off). It costs about
-- 1 us an insert (the setting is made and undone at each call).
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
        END IF;
        NEW.status := 'blocked';
    END IF;
    RETURN NEW;
END
$$ SET enable_sort = off;
