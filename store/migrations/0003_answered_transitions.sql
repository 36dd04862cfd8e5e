-- PEPSI schema, version 3: stages may answer their transition ("0 >TARGET") for
-- the dispatcher to write (docs/protocol.md). It counts, per stage, the answered
-- transitions it could not write because the row was no longer running there.
ALTER TABLE pepsi.stage_stats ADD COLUMN guard_misses bigint NOT NULL DEFAULT 0;
