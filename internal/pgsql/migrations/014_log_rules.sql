-- The rows of writers in other languages go into the log while the
-- database says log (design §3, "What changes for users"): the rules
-- trigger of migration 11, which runs for their rows only (those inserted
-- without a partition), checks a row as before, then, on an insert while
-- {prefix}storage says log, inserts it into the log and skips the
-- outbox's row. Such a row then costs the relays what postbox's own
-- writer's rows cost them, instead of the outbox's move into the history.
--
-- What a writer sees: while the database says log, its INSERT into the
-- outbox reports no row (a RETURNING clause returns none), and a second
-- pending row under an id already pending is not refused (the log has no
-- unique index on id); consumers absorb it by id, as a redelivery. While
-- it says table, nothing changes. The function is migration 11's, the
-- move added at its end, and the rules it names are the outbox's wherever
-- the row lives (the names of the table contract); it runs for an update
-- of a message in the log too (below).
CREATE OR REPLACE FUNCTION {prefix}outbox_rules() RETURNS trigger LANGUAGE plpgsql AS $rules$
DECLARE
    name   text;
    value  jsonb;
    text_  text;
    n      integer := 0;
    total  bigint := 0;
    rule   text;
    detail text;
    -- The rules are named after the outbox's table (the table contract),
    -- wherever the row lives.
    outbox_ text := '{prefix}outbox';
    log_    text := '{prefix}log';
BEGIN
    NEW.partition := ((('x' || substr(md5(coalesce(NEW.key, NEW.id::text)), 1, 8))::bit(32)::integer) & 2147483647) % 64;
    IF TG_TABLE_NAME <> outbox_ AND NEW.partition <> OLD.partition THEN
        -- An update of a row of the log (or of one of its chunks).
        RAISE EXCEPTION 'postbox: % breaks %_partition_check: a message in the log keeps its partition, and key % belongs to partition %, not %',
                TG_TABLE_NAME, log_, left(NEW.key, 64), NEW.partition, OLD.partition
            USING ERRCODE = 'check_violation', CONSTRAINT = log_ || '_partition_check',
                  TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    IF NOT (NEW.topic ~ '^[A-Za-z0-9._:-]+$' AND octet_length(NEW.topic) <= 255) THEN
        rule := 'topic';
        detail := format('topic %s is not 1 to 255 characters of A-Z, a-z, 0-9 and ._:-', left(NEW.topic, 64));
    ELSIF NEW.key IS NOT NULL AND octet_length(NEW.key) NOT BETWEEN 1 AND 255 THEN
        rule := 'key';
        detail := format('the key is %s bytes; a key is 1 to 255 bytes, or NULL', octet_length(NEW.key));
    ELSIF jsonb_typeof(NEW.headers) IS DISTINCT FROM 'object' THEN
        rule := 'headers';
        detail := format('headers is a JSON %s; it must be an object', coalesce(jsonb_typeof(NEW.headers), 'null'));
    ELSIF octet_length(NEW.payload) > 67108864 THEN
        rule := 'payload_size';
        detail := format('the payload is %s bytes, over the limit of 67108864', octet_length(NEW.payload));
    ELSE
        FOR name, value IN SELECT e.key, e.value FROM jsonb_each(NEW.headers) AS e LOOP
            IF jsonb_typeof(value) <> 'string' THEN
                rule := 'header_values';
                detail := format('header %s is a JSON %s; header values are strings', name, jsonb_typeof(value));
                EXIT;
            END IF;
            IF name !~ '^[-!#$%&''*+.^_`|~0-9A-Za-z]{1,128}$' THEN
                rule := 'header_names';
                detail := format('header name %s is not an HTTP token of 1 to 128 bytes', left(name, 64));
                EXIT;
            END IF;
            text_ := value #>> '{}';
            IF name NOT IN ('ce-source', 'ce-subject', 'ce-time', 'content-type') THEN
                IF (lower(name) ~ '^(ce-|ce_|cloudevents:|cloudevents_|nats-|postbox-)' OR lower(name) = 'content-type')
                   AND name NOT IN ('postbox-replay-of', 'postbox-replay') THEN
                    rule := 'header_reserved';
                    detail := format('header name %s is reserved (ce-*, ce_*, cloudEvents*, nats-*, postbox-*, content-type; a writer may store ce-source, ce-subject, ce-time and content-type, in lower case)', name);
                    EXIT;
                END IF;
                n := n + 1;
                total := total + octet_length(name) + octet_length(text_);
            END IF;
            IF octet_length(text_) > 4096 OR text_ ~ '[\x01-\x08\x0a-\x1f\x7f]' THEN
                rule := 'header_text';
                detail := format('the value of header %s must be text of at most 4096 bytes without control characters', name);
                EXIT;
            END IF;
        END LOOP;
        IF rule IS NULL AND n > 64 THEN
            rule := 'headers_count';
            detail := format('%s headers, over the limit of 64', n);
        ELSIF rule IS NULL AND total > 65536 THEN
            rule := 'headers_size';
            detail := format('headers total %s bytes, over the limit of 65536', total);
        END IF;
    END IF;
    IF rule IS NOT NULL THEN
        RAISE EXCEPTION 'postbox: % breaks %_%_check: %', TG_TABLE_NAME, outbox_, rule, detail
            USING ERRCODE = 'check_violation', CONSTRAINT = outbox_ || '_' || rule || '_check',
                  TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    -- A checked row of another writer goes into the log while the
    -- database says log (migration 13), by an insert of its own: the
    -- log's defaults assign the transaction its id (xid, the first
    -- column) before they draw the row's seq (design §3, "The
    -- position"), and the seq the outbox drew is left unused. The
    -- setting is read in the writer's transaction, as postbox's own
    -- writer reads it, so a switch waits for this transaction to end.
    IF TG_OP = 'INSERT' AND (SELECT s.storage FROM {prefix}storage s) = 'log' THEN
        INSERT INTO {prefix}log (id, topic, key, payload, headers, partition, created_at)
        VALUES (NEW.id, NEW.topic, NEW.key, NEW.payload, NEW.headers, NEW.partition, NEW.created_at);
        RETURN NULL;
    END IF;
    RETURN NEW;
END
$rules$;

-- An update of a message in the log is held to the same rules, named as
-- the outbox's (the table contract's), and may not move it to another
-- partition: the partitions' positions have passed or not passed each
-- row where it was written.
CREATE TRIGGER {prefix}log_rules_update BEFORE UPDATE OF id, topic, key, payload, headers, partition ON {prefix}log
    FOR EACH ROW EXECUTE FUNCTION {prefix}outbox_rules();
