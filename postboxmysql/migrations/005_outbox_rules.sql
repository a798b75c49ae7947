-- The rules Go's WriteTx applies to a message, for rows any writer inserts
-- with SQL (the table contract): the writer's own statement gets the
-- error, naming the rule, instead of the relay meeting the row at publish.
-- The topic, key and JSON-object rules are CHECK constraints of migration
-- 1; these need a loop over the headers, so a procedure that both
-- triggers call (on INSERT, and on an UPDATE that changes the headers or
-- the payload's size) checks them. Each error names its rule as the
-- table's name followed by _<rule>_check, as on PostgreSQL:
--
--   payload_size     the payload is at most 64 MiB (67108864 bytes), the
--                    hard maximum of Config.MaxPayloadBytes; the cap a
--                    Client configures (1 MiB by default) is Go's alone.
--                    A payload also needs max_allowed_packet above its size
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
-- postbox's own writer sets checked (migration 1): it applied the rules in
-- Go, and its rows skip them, as on PostgreSQL its rows that supply their
-- partition do.
-- The statements are separated by // (DELIMITER, as the mysql client
-- reads it), since the bodies hold semicolons.
DELIMITER //
CREATE PROCEDURE IF NOT EXISTS {prefix}outbox_rules(IN payload_len BIGINT, IN headers LONGTEXT CHARACTER SET utf8mb4)
    DETERMINISTIC
BEGIN
    DECLARE hnames, hvalue LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE hname, lname VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE i, n, counted INT DEFAULT 0;
    DECLARE total BIGINT DEFAULT 0;
    IF payload_len > 67108864 THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{prefix}outbox_payload_size_check: the payload is over 67108864 bytes';
    END IF;
    IF JSON_VALID(headers) AND JSON_TYPE(headers) = 'OBJECT' THEN
        SET hnames = JSON_KEYS(headers);
        SET n = JSON_LENGTH(hnames);
        WHILE i < n DO
            SET hname = JSON_UNQUOTE(JSON_EXTRACT(hnames, CONCAT('$[', i, ']')));
            SET hvalue = JSON_EXTRACT(headers, CONCAT('$.', JSON_QUOTE(hname)));
            SET lname = LOWER(hname);
            IF JSON_TYPE(hvalue) <> 'STRING' THEN
                SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{prefix}outbox_header_values_check: header values are JSON strings';
            END IF;
            IF NOT (OCTET_LENGTH(hname) BETWEEN 1 AND 128 AND hname REGEXP '^[-!#$%&''*+.^_`|~0-9A-Za-z]+$') THEN
                SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{prefix}outbox_header_names_check: header names are HTTP tokens of 1 to 128 bytes';
            END IF;
            IF hname NOT IN ('ce-source', 'ce-subject', 'ce-time', 'content-type', 'postbox-replay-of', 'postbox-replay')
               AND (LEFT(lname, 3) IN ('ce-', 'ce_') OR LEFT(lname, 12) IN ('cloudevents:', 'cloudevents_')
                    OR LEFT(lname, 5) = 'nats-' OR LEFT(lname, 8) = 'postbox-' OR lname = 'content-type') THEN
                SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{prefix}outbox_header_reserved_check: reserved header name';
            END IF;
            SET hvalue = JSON_UNQUOTE(hvalue);
            IF OCTET_LENGTH(hvalue) > 4096 OR REPLACE(hvalue, CHAR(9), '') REGEXP '[[:cntrl:]]' THEN
                SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{prefix}outbox_header_text_check: header values are text of at most 4096 bytes, no control characters';
            END IF;
            IF hname NOT IN ('ce-source', 'ce-subject', 'ce-time', 'content-type') THEN
                SET counted = counted + 1;
                SET total = total + OCTET_LENGTH(hname) + OCTET_LENGTH(hvalue);
            END IF;
            SET i = i + 1;
        END WHILE;
        IF counted > 64 THEN
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{prefix}outbox_headers_count_check: at most 64 headers besides the four attributes';
        END IF;
        IF total > 65536 THEN
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{prefix}outbox_headers_size_check: headers total over 65536 bytes besides the four attributes';
        END IF;
    END IF;
END
//
-- A row postbox's writer inserts (checked set) was held to the same rules
-- in Go and skips them.
CREATE TRIGGER IF NOT EXISTS {prefix}outbox_rules_insert BEFORE INSERT ON {prefix}outbox FOR EACH ROW
BEGIN
    IF NOT NEW.checked THEN
        CALL {prefix}outbox_rules(OCTET_LENGTH(NEW.payload), NEW.headers);
    END IF;
END
//
-- The relay's own updates change neither, and skip the procedure.
CREATE TRIGGER IF NOT EXISTS {prefix}outbox_rules_update BEFORE UPDATE ON {prefix}outbox FOR EACH ROW
BEGIN
    IF NOT (NEW.headers <=> OLD.headers) OR OCTET_LENGTH(NEW.payload) <> OCTET_LENGTH(OLD.payload) THEN
        CALL {prefix}outbox_rules(OCTET_LENGTH(NEW.payload), NEW.headers);
    END IF;
END
//
DELIMITER ;
