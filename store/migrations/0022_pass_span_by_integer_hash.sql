-- PEPSI schema, version 22: a pass's span id by an integer hash the
-- dispatcher computes itself, and a fresh trace without PL/pgSQL.
--
-- Schema 17 hashed the text "trace id:id:stage:epoch" with hashtextextended,
-- in the claim's RETURNING for every row of an INPUT = message stage, and gave
-- a message without a traceparent a fresh one through a PL/pgSQL function
-- around gen_random_uuid(). Both ran on the claim's backend, whose time bounds
-- hops/s (docs/performance.md, "Traces"): about 8 us of server CPU per hop of
-- message mode. Now:
--
-- pepsi.pass_span(trace_id, id, stage, claimed_at) is hashint8extended chained
-- over the two halves of the message's id and of the claim's microsecond since
-- 1970 (the id and the instant of the claim name a pass; the trace id and the
-- stage are kept as arguments, so callers of schema 17 go on working). It
-- works on integer values, so the dispatcher computes the same id in Go from
-- the row the claim returns (internal/traceparent.PassSpanID) instead of
-- asking the backend, and a stage reading its row computes it here.
--
-- pepsi.fresh_traceparent(id, seed, claimed_at) is a plain SQL expression the
-- planner inlines: a trace id hashed from the message's id and a random seed
-- the dispatcher draws for each statement (64 random bits per statement, two
-- hashes of 64 bits per message), flags 01, and as its parent span id the
-- span id of the first pass, as before.
CREATE OR REPLACE FUNCTION pepsi.pass_span(trace_id text, id bigint, stage text, claimed_at timestamptz)
RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT lpad(to_hex(hashint8extended((extract(epoch FROM claimed_at) * 1000000)::bigint >> 32,
                       hashint8extended((extract(epoch FROM claimed_at) * 1000000)::bigint,
                       hashint8extended(id >> 32, hashint8extended(id, 0))))), 16, '0')
$$;

-- Schema 17's pepsi.fresh_traceparent(id, stage, claimed_at) stays: a
-- dispatcher older than this schema calls it until it is restarted
-- (docs/operations.md, "Upgrading": an older dispatcher keeps working on a
-- newer schema). It now makes its parent span with the new pepsi.pass_span.
CREATE FUNCTION pepsi.fresh_traceparent(id bigint, seed bigint, claimed_at timestamptz)
RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT '00-' || lpad(to_hex(hashint8extended(id >> 32, hashint8extended(id, seed))), 16, '0')
                 || lpad(to_hex(hashint8extended(id >> 32, hashint8extended(id, seed # 6148914691236517205))), 16, '0')
        || '-' || pepsi.pass_span('', id, '', claimed_at) || '-01'
$$;
