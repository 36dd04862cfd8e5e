-- PEPSI schema, version 7: the dispatcher retries a message whose stage answers
-- "75 REASON" (a temporary failure) at a stage with RETRY_LIMIT > 0, and counts
-- the retries at the current stage here; it sets the count back to 0 whenever
-- the message moves to another stage (docs/protocol.md). A column with a
-- constant default is added without rewriting the table (PostgreSQL 11 and
-- later store the default in the catalog), so this is quick on a large queue.
ALTER TABLE pepsi.queue ADD COLUMN attempts integer NOT NULL DEFAULT 0;
