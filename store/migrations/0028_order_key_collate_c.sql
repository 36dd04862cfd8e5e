-- PEPSI schema, version 28: order keys compare byte for byte.
--
-- An order key is an opaque name (a customer's id, a mailbox): PEPSI only
-- asks whether two keys are the same, never which sorts first by a
-- language's rules. Under the database's default collation every
-- comparison of the two order-key indexes (queue_order_live,
-- queue_order_blocked) and of the claim's, the moves' and the release's
-- look-ups went through the locale (strcoll): with the column in collation
-- "C" they are a memcmp. On a C.UTF-8 database that is about 1.5 µs of the
-- server's CPU a keyed hop (docs/performance.md, "Ordering per key", 6
-- December 2026, evening); under a language's collation (en_US.UTF-8 and
-- the like) strcoll costs several times more.
--
-- Equality is the same under any deterministic collation, so no key changes
-- its messages; only an ORDER BY order_key of an operator's query sorts by
-- bytes now. Changing a column's collation does not rewrite the table; it
-- rebuilds the indexes on the column, under the table's lock, for as long
-- as reading their rows takes (the unfinished keyed messages: a backlog of
-- a million blocked ones takes seconds). The trigger whose WHEN clause
-- reads the column must be dropped for the change and is made again as it
-- was (same name, so BEFORE INSERT triggers keep their order).
DROP TRIGGER IF EXISTS queue_order_insert ON pepsi.queue;
ALTER TABLE pepsi.queue ALTER COLUMN order_key TYPE text COLLATE "C";
CREATE TRIGGER queue_order_insert BEFORE INSERT ON pepsi.queue
    FOR EACH ROW WHEN (NEW.order_key IS NOT NULL)
    EXECUTE FUNCTION pepsi.order_insert();
