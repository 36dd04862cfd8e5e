-- PEPSI schema, version 5: autovacuum settings for pepsi.queue. Every hop
-- rewrites its row (the claim, the transition), so the defaults (a vacuum once a
-- fifth of the table is dead) let millions of dead versions pile up in a large
-- queue before autovacuum looks at it. Vacuum it after a fixed number of dead
-- versions instead, whatever its size; these apply only where autovacuum runs
-- (pepsi-dispatch also vacuums the queue itself, unless VACUUM = off:
-- docs/operations.md, "Vacuum").
ALTER TABLE pepsi.queue SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 20000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 100000
);
