-- PEPSI schema, version 25: the insert trigger that checks a traceparent
-- leaves alone the rows a dispatcher inserts for its stages' emits (those with
-- a parent_id).
--
-- An emitted message's traceparent is its parent's pass's:
-- pepsi.pass_traceparent of the parent's own traceparent, which was checked
-- when it was written, with a span id of 16 hex digits in place of its
-- parent's; so it is well formed by construction. Checking it again cost the
-- trigger's call on every child, about 7 microseconds a row on the one
-- backend whose time bounds the dispatcher (a split stage's 640 children in
-- one resolve: 17 against 10 microseconds a row, docs/performance.md,
-- "Emitting messages"). Only the dispatcher's resolve sets parent_id
-- (pepsi-ingress and pepsi-queue enqueue have no such field); a row a
-- producer inserts, with no parent_id, is checked as before. The WHEN clause
-- stays free to prepare (schema 23): no function in it.
DROP TRIGGER IF EXISTS queue_traceparent_insert ON pepsi.queue;
CREATE TRIGGER queue_traceparent_insert BEFORE INSERT ON pepsi.queue
    FOR EACH ROW WHEN (NEW.traceparent IS NOT NULL AND NEW.parent_id IS NULL)
    EXECUTE FUNCTION pepsi.check_traceparent();
