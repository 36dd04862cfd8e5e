-- PEPSI schema, version 8: a producer's idempotency key (pepsi-ingress's "key").
-- A second insert with a key already in the queue inserts nothing; the key is
-- remembered as long as its row exists (pepsi-queue purge forgets it). The
-- column is added without rewriting the table; the unique index is built once,
-- holding off inserts while it is built (only rows with a key are in it, so on
-- a queue that never had keys the build reads the table once and stores nothing;
-- docs/operations.md says how to build it beforehand without blocking inserts).
ALTER TABLE pepsi.queue ADD COLUMN IF NOT EXISTS dedup_key text;
CREATE UNIQUE INDEX IF NOT EXISTS queue_dedup_key ON pepsi.queue (dedup_key) WHERE dedup_key IS NOT NULL;
