-- PEPSI schema, version 10: statistics flushes identified by the dispatcher's
-- life. A flush is applied at most once per (life, seq): each dispatcher life
-- (a random number drawn at its start) numbers its flushes 1, 2, … and
-- stats_flushes keeps the last applied seq of each life. A single sequence for
-- all dispatchers (dispatch_stats.flush_seq until now) dropped a new
-- dispatcher's flush when an earlier one's flush, whose reply was lost,
-- committed after the new one had read the sequence and with the number the
-- new one then used. dispatch_stats.flush_seq now counts the flushes applied.
-- Rows of lives not heard of for 30 days are deleted at a dispatcher's start-up
-- reset: a flush can only be sent again by a life that is running.
CREATE TABLE pepsi.stats_flushes (
    life       bigint      PRIMARY KEY,
    seq        bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
