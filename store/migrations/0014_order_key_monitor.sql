-- PEPSI schema, version 14: pepsi-httpd reads order_key, to count the order
-- keys whose messages wait behind an older message of their key
-- (pepsi_queue_order_keys_waiting). An existing pepsi_monitor role, made
-- with the grants pepsi-httpd(8) gave before, is granted the column here, as
-- version 13 granted ready_at, so that pepsi-httpd reads it as it reads the
-- rest.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pepsi_monitor') THEN
        GRANT SELECT (order_key) ON pepsi.queue TO pepsi_monitor;
    END IF;
END
$$;
