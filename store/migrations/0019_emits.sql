-- PEPSI schema, version 19: messages a stage emits (docs/protocol.md,
-- "Emitting messages"). parent_id is, for a message a stage's pass emitted,
-- the ingress_id of the message whose pass emitted it; the dispatcher inserts
-- such messages in the transaction that writes that pass's answered
-- transition. NULL for every other message: the column is added without
-- rewriting the table, and the index, partial, holds only the children (so
-- "how many children has this message" reads only them).
ALTER TABLE pepsi.queue ADD COLUMN IF NOT EXISTS parent_id bigint;
CREATE INDEX IF NOT EXISTS queue_parent ON pepsi.queue (parent_id) WHERE parent_id IS NOT NULL;

-- emitted counts the messages a stage's passes emitted whose transition was
-- written; emits_dropped those that inserted nothing (emitted before an
-- answer other than a transition the dispatcher writes, or a guard miss).
-- Columns with a constant default are added without rewriting the table.
ALTER TABLE pepsi.stage_stats ADD COLUMN IF NOT EXISTS emitted bigint NOT NULL DEFAULT 0;
ALTER TABLE pepsi.stage_stats ADD COLUMN IF NOT EXISTS emits_dropped bigint NOT NULL DEFAULT 0;

-- pepsi-httpd's message page names a message's parent: an existing
-- pepsi_monitor role, made with the grants pepsi-httpd(8) gave before, is
-- granted the column here, as version 14 granted order_key.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pepsi_monitor') THEN
        GRANT SELECT (parent_id) ON pepsi.queue TO pepsi_monitor;
    END IF;
END
$$;
