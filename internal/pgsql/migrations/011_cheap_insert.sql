-- A WriteTx of one message costs about what a bare row costs (BENCHMARKS.md,
-- "Where a write's server CPU went"). PostgreSQL rebuilds every CHECK
-- constraint, generated column and trigger WHEN clause of a table from its
-- stored text at the start of each INSERT, so for the usual one-row
-- statement that start cost more than the row: five constraints, the md5
-- partition column and the rules' WHEN look were three quarters of it, and
-- the topic's bounded repetition ({1,255}) compiled into a regex that cost
-- as much again per row.
--
-- What stays the same for a writer: every rule of migrations 1 and 5 holds
-- for a row inserted with SQL, failing in the writer's statement with a
-- check_violation named <table>_<rule>_check, and partition is still
-- md5(key, or id) mod 64, computed by the database.
--
-- What changed: partition is an ordinary column. A writer that leaves it
-- out (the table contract: every writer in another language) gets it
-- computed and the row checked by the trigger below. postbox's own writer
-- computes it (postboxdriver.PartitionOf, the same value, held to the SQL
-- by the drivers' conformance suite) and has already applied the same rules
-- in Go, so its rows skip the trigger: the WHEN clause is one null test. A
-- writer in another language must therefore leave partition out. An update
-- of id, topic, key, payload, headers or partition runs the rules and
-- computes partition again; the relay's own updates touch none of those.
--
-- The relay's columns (inflight, crashes) lose their CHECK constraints for
-- the same reason: only the relay's statements write them.
ALTER TABLE {prefix}outbox ALTER COLUMN partition DROP EXPRESSION;
ALTER TABLE {prefix}outbox DROP CONSTRAINT {prefix}outbox_topic_check;
ALTER TABLE {prefix}outbox DROP CONSTRAINT {prefix}outbox_key_check;
ALTER TABLE {prefix}outbox DROP CONSTRAINT {prefix}outbox_headers_check;
ALTER TABLE {prefix}outbox DROP CONSTRAINT {prefix}outbox_inflight_check;
ALTER TABLE {prefix}outbox DROP CONSTRAINT {prefix}outbox_crashes_check;
DROP TRIGGER {prefix}outbox_rules ON {prefix}outbox;

-- The rules of migration 5, with the three CHECK constraints of migration 1
-- (topic, key, headers) before them, and the partition computed.
CREATE OR REPLACE FUNCTION {prefix}outbox_rules() RETURNS trigger LANGUAGE plpgsql AS $rules$
DECLARE
    name   text;
    value  jsonb;
    text_  text;
    n      integer := 0;
    total  bigint := 0;
    rule   text;
    detail text;
BEGIN
    NEW.partition := ((('x' || substr(md5(coalesce(NEW.key, NEW.id::text)), 1, 8))::bit(32)::integer) & 2147483647) % 64;
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
        RAISE EXCEPTION 'postbox: % breaks %_%_check: %', TG_TABLE_NAME, TG_TABLE_NAME, rule, detail
            USING ERRCODE = 'check_violation', CONSTRAINT = TG_TABLE_NAME || '_' || rule || '_check',
                  TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    RETURN NEW;
END
$rules$;

CREATE TRIGGER {prefix}outbox_rules BEFORE INSERT ON {prefix}outbox
    FOR EACH ROW WHEN (NEW.partition IS NULL) EXECUTE FUNCTION {prefix}outbox_rules();
CREATE TRIGGER {prefix}outbox_rules_update BEFORE UPDATE OF id, topic, key, payload, headers, partition ON {prefix}outbox
    FOR EACH ROW EXECUTE FUNCTION {prefix}outbox_rules();
