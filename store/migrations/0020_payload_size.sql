-- PEPSI schema, version 20: pepsi-httpd's message page shows a message's
-- payload size, which its role cannot read: pepsi_monitor has no SELECT on
-- payload, so that the database itself guarantees pepsi-httpd shows no
-- payload (pepsi-httpd(8), "DATABASE ROLE").
--
-- pepsi.payload_size(id) is octet_length(payload) of one message, NULL for a
-- message without a payload or no message, computed with its owner's rights
-- (SECURITY DEFINER). It is the least privilege that answers the question: a
-- grant of the payload column would let the role read every payload's bytes;
-- this function tells only a length, of one message at a time, by its primary
-- key. Functions are executable by PUBLIC unless revoked: this one is revoked
-- and granted to pepsi_monitor alone. Its search_path is pinned, as a
-- SECURITY DEFINER function's must be, so that no object of the caller's can
-- stand in for those it names. octet_length of a toasted bytea reads the
-- value's header, never the payload itself.
CREATE FUNCTION pepsi.payload_size(id bigint) RETURNS bigint
LANGUAGE sql STABLE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT octet_length(q.payload)::bigint FROM pepsi.queue q WHERE q.ingress_id = id $$;

REVOKE EXECUTE ON FUNCTION pepsi.payload_size(bigint) FROM PUBLIC;

-- An existing pepsi_monitor role, made with the grants pepsi-httpd(8) gave
-- before, is granted it here, as version 14 granted order_key. (The message
-- page's children are counted through schema 19's queue_parent index.)
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pepsi_monitor') THEN
        GRANT EXECUTE ON FUNCTION pepsi.payload_size(bigint) TO pepsi_monitor;
    END IF;
END
$$;
