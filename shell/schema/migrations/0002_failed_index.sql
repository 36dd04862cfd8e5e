-- PEPSI schema, version 2: an index over the messages that left the pipeline
-- unsuccessfully, so pepsi-httpd can count failed and timed-out messages per
-- stage and list the latest failures without scanning the whole queue. Only rows
-- that fail or time out enter it: the pipeline's normal writes never touch it.
-- Building it reads the table once and blocks writes to pepsi.queue meanwhile
-- (seconds per million rows; docs/operations.md "Upgrading the schema").
CREATE INDEX queue_failed ON pepsi.queue (updated_at, stage, status)
    WHERE status IN ('failed', 'timeout');
