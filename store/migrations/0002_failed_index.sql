-- PEPSI schema, version 2: an index over the messages that left the pipeline
-- unsuccessfully, so pepsi-httpd can count failed and timed-out messages per
-- stage and list the latest failures without scanning the whole queue. Only rows
-- that fail or time out enter it: the pipeline's normal writes never touch it.
-- Building it reads the table once and blocks writes to pepsi.queue meanwhile
-- (under a second per million rows). IF NOT EXISTS: an operator may have built it
-- beforehand with CREATE INDEX CONCURRENTLY (docs/operations.md "Upgrading").
CREATE INDEX IF NOT EXISTS queue_failed ON pepsi.queue (updated_at, stage, status)
    WHERE status IN ('failed', 'timeout');
