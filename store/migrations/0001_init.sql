-- PEPSI schema, version 1. Needs PostgreSQL 13 or later (gen_random_uuid).
CREATE SCHEMA IF NOT EXISTS pepsi;

-- One row per message. See docs/protocol.md, "The queue and who writes what".
CREATE TABLE pepsi.queue (
    ingress_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stage      text        NOT NULL,
    status     text        NOT NULL DEFAULT 'pending'
               CHECK (status IN ('pending', 'running', 'paused', 'done', 'failed', 'timeout')),
    timeout    timestamptz,
    state      jsonb       NOT NULL DEFAULT '{}',
    payload    bytea,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The claim walks this index per stage in arrival order and stops at the cap.
CREATE INDEX queue_pending ON pepsi.queue (stage, ingress_id) WHERE status = 'pending';
-- Due paused rows and the earliest paused timeout.
CREATE INDEX queue_paused ON pepsi.queue (timeout) WHERE status = 'paused';
-- The start-up (and lost-claim) reset of orphaned running rows.
CREATE INDEX queue_running ON pepsi.queue (ingress_id) WHERE status = 'running';

-- A statement-level trigger: a bulk insert wakes the dispatcher once.
CREATE FUNCTION pepsi.notify_ingress() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ingress', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER queue_notify_ingress AFTER INSERT ON pepsi.queue
    FOR EACH STATEMENT EXECUTE FUNCTION pepsi.notify_ingress();

-- Written only by pepsi-dispatch, as deltas, in one transaction per flush.
CREATE TABLE pepsi.stage_stats (
    stage         text PRIMARY KEY,
    processed     bigint      NOT NULL DEFAULT 0,
    failed        bigint      NOT NULL DEFAULT 0,
    timeouts      bigint      NOT NULL DEFAULT 0,
    crashes       bigint      NOT NULL DEFAULT 0,
    processing_us bigint      NOT NULL DEFAULT 0,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- One row. flush_seq makes a flush idempotent: a flush whose reply was lost and
-- that is sent again with the same sequence number is applied once.
CREATE TABLE pepsi.dispatch_stats (
    one           boolean PRIMARY KEY DEFAULT true CHECK (one),
    stage_passes  bigint      NOT NULL DEFAULT 0,
    messages_left bigint      NOT NULL DEFAULT 0,
    flush_seq     bigint      NOT NULL DEFAULT 0,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
INSERT INTO pepsi.dispatch_stats DEFAULT VALUES;

-- The crash sentinel. UNLOGGED tables are emptied by crash recovery and kept by a
-- clean shutdown, so a token that is still here proves no crash has happened since
-- it was written: every stage commit made after it (even with synchronous_commit
-- off) is still in the database. See docs/durability.md.
CREATE UNLOGGED TABLE pepsi.dispatch_epoch (
    token text NOT NULL
);
