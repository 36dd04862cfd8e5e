-- PEPSI schema, version 6: producers say they are mid-transaction. An insert
-- takes its ingress_id when it runs, but its row appears only at commit, so a
-- claim may see a row while a producer still holds a lower id. The dispatcher's
-- claims look only above each stage's floor (docs/durability.md, "Claims look
-- above a floor"), and may raise a floor past an id only once no producer could still
-- commit a row there. So every INSERT (or COPY) into pepsi.queue first takes
-- advisory lock 0x7065707370726f64 ("pepsprod", pgqueue.ProducerKey) shared, for
-- the rest of its transaction, before any id is taken. Nobody takes it
-- exclusively, so it never waits; the dispatcher only reads pg_locks: when no
-- session holds it, every id already visible had settled. A pepsi-dispatch of
-- this version needs it (it checks the schema version at start).
CREATE FUNCTION pepsi.producer_in_flight() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(8099003146005802852);
    RETURN NULL;
END
$$;
CREATE TRIGGER queue_producer_in_flight BEFORE INSERT ON pepsi.queue
    FOR EACH STATEMENT EXECUTE FUNCTION pepsi.producer_in_flight();
