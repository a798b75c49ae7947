-- The rules Go's WriteTx applies to a message, for rows any writer inserts
-- with SQL (the table contract): the writer's own transaction gets the
-- error, naming the rule, instead of the relay meeting the row at publish.
-- The topic and key rules are CHECK constraints of migration 1.
--
-- A trigger rather than CHECK constraints: it runs on INSERT and on an
-- UPDATE of payload or headers only, so the relay's own updates (attempts,
-- backoff) never meet rows written before this migration, and it names
-- the header at fault. The error is a check_violation whose constraint is
-- the table's name followed by _<rule>_check:
--
--   payload_size     the payload is at most 64 MiB (67108864 bytes), the
--                    hard maximum of Config.MaxPayloadBytes; the cap a
--                    Client configures (1 MiB by default) is Go's alone
--   header_values    every header value is a JSON string
--   header_names     every name is an HTTP token of 1 to 128 bytes
--   header_reserved  no name begins with ce-, ce_, cloudEvents:,
--                    cloudEvents_, nats- or postbox- (in any case) or is
--                    content-type, except the attributes a writer stores:
--                    ce-source, ce-subject, ce-time and content-type,
--                    spelled so, and the two a replay as new messages
--                    sets (postbox-replay-of, postbox-replay)
--   header_text      every value is at most 4096 bytes of text without
--                    control characters other than tab
--   headers_count    at most 64 headers besides those four attributes
--   headers_size     at most 65536 bytes of names and values besides them
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
    IF octet_length(NEW.payload) > 67108864 THEN
        rule := 'payload_size';
        detail := format('the payload is %s bytes, over the limit of 67108864', octet_length(NEW.payload));
    ELSIF jsonb_typeof(NEW.headers) = 'object' THEN
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

-- The WHEN clause is a cheap look first, for every row: only a row that
-- may break a rule runs the function, which decides and names the rule.
-- It reads the headers' text (jsonb prints every string with its quotes
-- and control characters escaped, so outside a backslash every quote is a
-- delimiter) for a backslash or a DEL, a value that is not a string, an
-- empty, long or non-token name, or a name with a reserved prefix once the
-- names a writer may store are taken out; and the sizes. A row the Go
-- writer wrote, already held to the rules, costs the look alone: about a
-- third of what the function costs (BENCHMARKS.md, "The table rules").
CREATE TRIGGER {prefix}outbox_rules BEFORE INSERT OR UPDATE OF payload, headers ON {prefix}outbox
    FOR EACH ROW
    WHEN (octet_length(NEW.payload) > 67108864
          OR jsonb_typeof(NEW.headers) = 'object' AND (
                 octet_length(NEW.headers::text) > 4096
              OR octet_length(NEW.headers::text) > 512
                 AND jsonb_array_length(jsonb_path_query_array(NEW.headers, '$.keyvalue()')) > 64
              OR octet_length(NEW.headers::text) > 130 AND NEW.headers::text ~ $re$(^\{|, )"[^"]{129}$re$
              OR NEW.headers::text ~ $re$\\|\x7f|": [^"]|(^\{|, )"(": |[^"]*[^-!#$%&'*+.^_`|~0-9A-Za-z"][^"]*": )$re$
              OR replace(replace(replace(replace(replace(replace(NEW.headers::text,
                   '"ce-source": ', ''), '"ce-subject": ', ''), '"ce-time": ', ''), '"content-type": ', ''),
                   '"postbox-replay-of": ', ''), '"postbox-replay": ', '')
                 ~* $re$(^\{|, )"(ce-|ce_|cloudevents:|cloudevents_|nats-|postbox-|content-type")$re$))
    EXECUTE FUNCTION {prefix}outbox_rules();
