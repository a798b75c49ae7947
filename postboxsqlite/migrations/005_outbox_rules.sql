-- The rules Go's WriteTx applies to a message, for rows any writer inserts
-- with SQL (the table contract): the writer's own transaction gets the
-- error, naming the rule, instead of the relay meeting the row at publish.
-- The topic, key and JSON-object rules are CHECK constraints of migration
-- 1. SQLite allows no subquery in a CHECK constraint and no new constraint
-- on a table, so these are triggers, on INSERT and on an UPDATE of payload
-- or headers (the relay's own updates never meet them). Each error names
-- its rule as the table's name followed by _<rule>_check, as on
-- PostgreSQL:
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
--
-- Headers that are not a JSON object are left to the CHECK constraint.
CREATE TRIGGER {prefix}outbox_rules_insert BEFORE INSERT ON {prefix}outbox
BEGIN
    SELECT CASE
        WHEN length(NEW.payload) > 67108864 THEN
            RAISE(ABORT, 'postbox: {prefix}outbox breaks {prefix}outbox_payload_size_check: the payload is over 67108864 bytes')
        WHEN NOT json_valid(NEW.headers) OR json_type(NEW.headers) <> 'object' THEN NULL
        WHEN EXISTS (SELECT 1 FROM json_each(NEW.headers) WHERE type <> 'text') THEN
            RAISE(ABORT, 'postbox: {prefix}outbox breaks {prefix}outbox_header_values_check: header values are JSON strings')
        WHEN EXISTS (SELECT 1 FROM json_each(NEW.headers)
                     WHERE length(key) NOT BETWEEN 1 AND 128 OR key GLOB '*[^!#$%&''*+.^_`|~0-9A-Za-z-]*') THEN
            RAISE(ABORT, 'postbox: {prefix}outbox breaks {prefix}outbox_header_names_check: header names are HTTP tokens of 1 to 128 bytes')
        WHEN EXISTS (SELECT 1 FROM json_each(NEW.headers)
                     WHERE key NOT IN ('ce-source', 'ce-subject', 'ce-time', 'content-type', 'postbox-replay-of', 'postbox-replay')
                       AND (lower(key) GLOB 'ce-*' OR lower(key) GLOB 'ce_*' OR lower(key) GLOB 'cloudevents:*'
                            OR lower(key) GLOB 'cloudevents_*' OR lower(key) GLOB 'nats-*' OR lower(key) GLOB 'postbox-*'
                            OR lower(key) = 'content-type')) THEN
            RAISE(ABORT, 'postbox: {prefix}outbox breaks {prefix}outbox_header_reserved_check: header names ce-*, ce_*, cloudEvents*, nats-*, postbox-* and content-type are reserved; a writer may store ce-source, ce-subject, ce-time and content-type, in lower case')
        WHEN EXISTS (SELECT 1 FROM json_each(NEW.headers)
                     WHERE length(CAST(value AS BLOB)) > 4096
                        OR value GLOB '*[' || char(1) || '-' || char(8) || char(10) || '-' || char(31) || char(127) || ']*') THEN
            RAISE(ABORT, 'postbox: {prefix}outbox breaks {prefix}outbox_header_text_check: header values are text of at most 4096 bytes without control characters')
        WHEN (SELECT count(*) FROM json_each(NEW.headers)
              WHERE key NOT IN ('ce-source', 'ce-subject', 'ce-time', 'content-type')) > 64 THEN
            RAISE(ABORT, 'postbox: {prefix}outbox breaks {prefix}outbox_headers_count_check: at most 64 headers besides ce-source, ce-subject, ce-time and content-type')
        WHEN (SELECT coalesce(sum(length(CAST(key AS BLOB)) + length(CAST(value AS BLOB))), 0) FROM json_each(NEW.headers)
              WHERE key NOT IN ('ce-source', 'ce-subject', 'ce-time', 'content-type')) > 65536 THEN
            RAISE(ABORT, 'postbox: {prefix}outbox breaks {prefix}outbox_headers_size_check: headers total over 65536 bytes besides ce-source, ce-subject, ce-time and content-type')
    END;
END;

-- The same rules for an update of the payload or the headers.
CREATE TRIGGER {prefix}outbox_rules_update BEFORE UPDATE OF payload, headers ON {prefix}outbox
BEGIN
    SELECT CASE
        WHEN length(NEW.payload) > 67108864 THEN
            RAISE(ABORT, 'postbox: {prefix}outbox breaks {prefix}outbox_payload_size_check: the payload is over 67108864 bytes')
        WHEN NOT json_valid(NEW.headers) OR json_type(NEW.headers) <> 'object' THEN NULL
        WHEN EXISTS (SELECT 1 FROM json_each(NEW.headers) WHERE type <> 'text') THEN
            RAISE(ABORT, 'postbox: {prefix}outbox breaks {prefix}outbox_header_values_check: header values are JSON strings')
        WHEN EXISTS (SELECT 1 FROM json_each(NEW.headers)
                     WHERE length(key) NOT BETWEEN 1 AND 128 OR key GLOB '*[^!#$%&''*+.^_`|~0-9A-Za-z-]*') THEN
            RAISE(ABORT, 'postbox: {prefix}outbox breaks {prefix}outbox_header_names_check: header names are HTTP tokens of 1 to 128 bytes')
        WHEN EXISTS (SELECT 1 FROM json_each(NEW.headers)
                     WHERE key NOT IN ('ce-source', 'ce-subject', 'ce-time', 'content-type', 'postbox-replay-of', 'postbox-replay')
                       AND (lower(key) GLOB 'ce-*' OR lower(key) GLOB 'ce_*' OR lower(key) GLOB 'cloudevents:*'
                            OR lower(key) GLOB 'cloudevents_*' OR lower(key) GLOB 'nats-*' OR lower(key) GLOB 'postbox-*'
                            OR lower(key) = 'content-type')) THEN
            RAISE(ABORT, 'postbox: {prefix}outbox breaks {prefix}outbox_header_reserved_check: header names ce-*, ce_*, cloudEvents*, nats-*, postbox-* and content-type are reserved; a writer may store ce-source, ce-subject, ce-time and content-type, in lower case')
        WHEN EXISTS (SELECT 1 FROM json_each(NEW.headers)
                     WHERE length(CAST(value AS BLOB)) > 4096
                        OR value GLOB '*[' || char(1) || '-' || char(8) || char(10) || '-' || char(31) || char(127) || ']*') THEN
            RAISE(ABORT, 'postbox: {prefix}outbox breaks {prefix}outbox_header_text_check: header values are text of at most 4096 bytes without control characters')
        WHEN (SELECT count(*) FROM json_each(NEW.headers)
              WHERE key NOT IN ('ce-source', 'ce-subject', 'ce-time', 'content-type')) > 64 THEN
            RAISE(ABORT, 'postbox: {prefix}outbox breaks {prefix}outbox_headers_count_check: at most 64 headers besides ce-source, ce-subject, ce-time and content-type')
        WHEN (SELECT coalesce(sum(length(CAST(key AS BLOB)) + length(CAST(value AS BLOB))), 0) FROM json_each(NEW.headers)
              WHERE key NOT IN ('ce-source', 'ce-subject', 'ce-time', 'content-type')) > 65536 THEN
            RAISE(ABORT, 'postbox: {prefix}outbox breaks {prefix}outbox_headers_size_check: headers total over 65536 bytes besides ce-source, ce-subject, ce-time and content-type')
    END;
END;
