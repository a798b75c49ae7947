-- The key rule of the table contract, whole: Go's WriteTx refuses a key
-- that holds a NUL byte, and the CHECK constraint of migration 1 bounds
-- only its length. A key that is not UTF-8 text is refused by the column
-- itself (error 1366, under the default strict mode), but the column
-- takes a NUL byte. The rules triggers of migration 5 now refuse it too,
-- in a row any writer inserts with SQL and in an update that changes the
-- key, with SQLSTATE 45000 naming the same rule as the length check,
-- {prefix}outbox_key_check. Rows postbox's own writer inserts (checked
-- set) skip it, as they skip the other rules; the relay's own updates
-- never change the key. Rows written before this migration are not
-- checked: requeueing or replaying one with such a key fails, naming the
-- rule.
--
-- MySQL has no CREATE OR REPLACE TRIGGER, and commits each statement at
-- once: each trigger is replaced through a second one, created with the
-- new body before the old one is dropped and dropped once the old name
-- has the new body, so that whenever this migration is cut short the
-- rules of migration 5 still hold every insert and update (for a moment
-- both triggers run them), and a run again whole ends with one trigger of
-- each name.
DELIMITER //
CREATE TRIGGER IF NOT EXISTS {prefix}outbox_rules_insert_6 BEFORE INSERT ON {prefix}outbox FOR EACH ROW
BEGIN
    IF NOT NEW.checked THEN
        IF LOCATE(CHAR(0), NEW.`key`) > 0 THEN
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{prefix}outbox_key_check: the key holds a NUL byte';
        END IF;
        CALL {prefix}outbox_rules(OCTET_LENGTH(NEW.payload), NEW.headers);
    END IF;
END
//
DROP TRIGGER IF EXISTS {prefix}outbox_rules_insert
//
CREATE TRIGGER IF NOT EXISTS {prefix}outbox_rules_insert BEFORE INSERT ON {prefix}outbox FOR EACH ROW
BEGIN
    IF NOT NEW.checked THEN
        IF LOCATE(CHAR(0), NEW.`key`) > 0 THEN
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{prefix}outbox_key_check: the key holds a NUL byte';
        END IF;
        CALL {prefix}outbox_rules(OCTET_LENGTH(NEW.payload), NEW.headers);
    END IF;
END
//
DROP TRIGGER IF EXISTS {prefix}outbox_rules_insert_6
//
CREATE TRIGGER IF NOT EXISTS {prefix}outbox_rules_update_6 BEFORE UPDATE ON {prefix}outbox FOR EACH ROW
BEGIN
    IF NOT (NEW.`key` <=> OLD.`key`) AND LOCATE(CHAR(0), NEW.`key`) > 0 THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{prefix}outbox_key_check: the key holds a NUL byte';
    END IF;
    IF NOT (NEW.headers <=> OLD.headers) OR OCTET_LENGTH(NEW.payload) <> OCTET_LENGTH(OLD.payload) THEN
        CALL {prefix}outbox_rules(OCTET_LENGTH(NEW.payload), NEW.headers);
    END IF;
END
//
DROP TRIGGER IF EXISTS {prefix}outbox_rules_update
//
CREATE TRIGGER IF NOT EXISTS {prefix}outbox_rules_update BEFORE UPDATE ON {prefix}outbox FOR EACH ROW
BEGIN
    IF NOT (NEW.`key` <=> OLD.`key`) AND LOCATE(CHAR(0), NEW.`key`) > 0 THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{prefix}outbox_key_check: the key holds a NUL byte';
    END IF;
    IF NOT (NEW.headers <=> OLD.headers) OR OCTET_LENGTH(NEW.payload) <> OCTET_LENGTH(OLD.payload) THEN
        CALL {prefix}outbox_rules(OCTET_LENGTH(NEW.payload), NEW.headers);
    END IF;
END
//
DROP TRIGGER IF EXISTS {prefix}outbox_rules_update_6
//
DELIMITER ;
