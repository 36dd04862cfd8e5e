-- PEPSI schema, version 17: traces. A message's W3C trace context
-- (docs/protocol.md, "Traces"): its traceparent, "00-<trace id>-<parent span
-- id>-<flags>", lower-case hex, given by its producer or, when it has none,
-- by the dispatcher's claim of its first pass, so that all its passes form
-- one trace.
--
-- The column is added without a rewrite (no default). Its CHECK is added
-- NOT VALID and then validated, but in this one transaction, so the
-- validation still scans the table under the ALTER's exclusive lock, which
-- is held to the commit (docs/operations.md, "Schema version 17": 0.6 s for
-- 3,000,000 rows). (This comment said otherwise until it was measured; the
-- statements are unchanged.)
ALTER TABLE pepsi.queue ADD COLUMN IF NOT EXISTS traceparent text;
ALTER TABLE pepsi.queue DROP CONSTRAINT IF EXISTS queue_traceparent_check;
ALTER TABLE pepsi.queue ADD CONSTRAINT queue_traceparent_check
    CHECK (traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$') NOT VALID;
ALTER TABLE pepsi.queue VALIDATE CONSTRAINT queue_traceparent_check;

-- The span id of one pass: a hash of the message's trace id, its id, the
-- stage and the time its claim wrote the row (updated_at: the claim's
-- transaction time). The dispatcher's claim and an INPUT = id stage reading
-- the row it was handed compute the same value, so a stage that has only
-- the id still knows its pass's span (pepsi.pass_traceparent below). Two
-- passes of one message at one stage are two claims, two transactions, two
-- times, two span ids. Not a secret and not random: a span id only has to
-- be unique within its trace. STABLE and a single expression, so the
-- planner inlines it.
CREATE OR REPLACE FUNCTION pepsi.pass_span(trace_id text, id bigint, stage text, claimed_at timestamptz)
RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT lpad(to_hex(hashtextextended(trace_id || ':' || id || ':' || stage || ':' || extract(epoch FROM claimed_at), 0)), 16, '0')
$$;

-- The traceparent of the pass a row is in: the message's, with the pass's
-- span id in place of its parent's. For a row running at its stage:
--     SELECT pepsi.pass_traceparent(traceparent, ingress_id, stage, updated_at)
--     FROM pepsi.queue WHERE ingress_id = $1
CREATE OR REPLACE FUNCTION pepsi.pass_traceparent(traceparent text, id bigint, stage text, claimed_at timestamptz)
RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT substr(traceparent, 1, 36) || pepsi.pass_span(substr(traceparent, 4, 32), id, stage, claimed_at) || substr(traceparent, 53)
$$;

-- A fresh traceparent for a message that has none, given by the claim of
-- its first pass (claimed_at its updated_at): a random trace id (a v4 UUID's
-- 122 random bits; its 7 rightmost bytes are all random, as W3C Trace
-- Context level 2 asks), sampled, whose parent span id is that first pass's
-- own span id: the first pass is the trace's root, and the later passes are
-- its children. Not inlined (its random trace id is used twice), so it costs
-- a function call, once in a message's life.
CREATE OR REPLACE FUNCTION pepsi.fresh_traceparent(id bigint, stage text, claimed_at timestamptz)
RETURNS text LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    t text := replace(gen_random_uuid()::text, '-', '');
BEGIN
    RETURN '00-' || t || '-' || pepsi.pass_span(t, id, stage, claimed_at) || '-01';
END
$$;
