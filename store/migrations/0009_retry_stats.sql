-- PEPSI schema, version 9: per-stage statistics of retries and rates. retries
-- counts messages the dispatcher paused for a retry (answer "75 REASON" at a
-- stage with RETRY_LIMIT > 0); rate_held_us is how long, in microseconds, the
-- stage had work it could have claimed but its RATE had no token for it.
-- Columns with a constant default are added without rewriting the table.
ALTER TABLE pepsi.stage_stats ADD COLUMN retries bigint NOT NULL DEFAULT 0;
ALTER TABLE pepsi.stage_stats ADD COLUMN rate_held_us bigint NOT NULL DEFAULT 0;
