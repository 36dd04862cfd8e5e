-- PEPSI schema, version 11: attempts is 0 again on every move to another
-- stage, whoever writes it. The dispatcher sets it to 0 in its own moves; a
-- stage that advances its message itself (UPDATE … SET stage = 'next') does
-- not know of the column, and if the dispatcher died before it saw that
-- advance, the start-up reset made the row pending at the next stage with the
-- retries of the stage before. This trigger sets attempts to 0 in any update
-- that changes stage and leaves attempts as it was. Its WHEN clause is
-- evaluated without calling the function, so an update that does not change
-- the stage, or finds attempts already 0, costs nothing more.
CREATE FUNCTION pepsi.queue_attempts_reset() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.attempts := 0;
    RETURN NEW;
END
$$;

CREATE TRIGGER queue_attempts_reset
    BEFORE UPDATE OF stage ON pepsi.queue
    FOR EACH ROW
    WHEN (NEW.stage IS DISTINCT FROM OLD.stage AND NEW.attempts <> 0 AND NEW.attempts = OLD.attempts)
    EXECUTE FUNCTION pepsi.queue_attempts_reset();
