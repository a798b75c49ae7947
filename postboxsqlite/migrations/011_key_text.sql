-- The key rule of the table contract, whole: Go's WriteTx refuses a key
-- that is not valid UTF-8 text or holds a NUL byte, and the CHECK
-- constraint of migration 1 bounds only its length. SQLite stores any
-- bytes in a TEXT column, so these triggers refuse such a key in a row any
-- writer inserts with SQL (and in an update of the key), naming the same
-- rule as the length check, {prefix}outbox_key_check.
--
-- SQLite has no UTF-8 validation of its own, so the text is read back
-- character by character: char(unicode(c)) is the shortest UTF-8 encoding
-- of the code point SQLite decodes from c, so it differs from c's bytes
-- exactly when c is not one valid UTF-8 sequence (a stray continuation
-- byte, a truncated or overlong sequence, a surrogate, a code point above
-- U+10FFFF, a byte F5 to FF). U+FFFE and U+FFFF, which SQLite decodes as
-- U+FFFD, are valid and compared as such. length() and substr() stop at
-- a NUL byte, which is refused first. The json_each over a generated
-- array of length(key) elements numbers the characters (a trigger takes
-- no WITH clause).
--
-- Keys of ASCII text without NUL, the usual case, take only the WHEN
-- clause; the walk runs for keys with other bytes, at most 255 of them.
-- Rows written before this migration are not checked.
CREATE TRIGGER {prefix}outbox_key_text_insert BEFORE INSERT ON {prefix}outbox
WHEN NEW.key IS NOT NULL
     AND (instr(CAST(NEW.key AS BLOB), x'00') > 0 OR NEW.key GLOB '*[^' || char(1) || '-' || char(127) || ']*')
BEGIN
    SELECT RAISE(ABORT, 'postbox: {prefix}outbox breaks {prefix}outbox_key_check: the key is not valid UTF-8 text, or holds a NUL byte')
    WHERE instr(CAST(NEW.key AS BLOB), x'00') > 0
       OR EXISTS (SELECT 1 FROM json_each('[' || rtrim(replace(hex(zeroblob(length(NEW.key))), '00', '0,'), ',') || ']') AS c
                  WHERE substr(NEW.key, c.key + 1, 1) NOT IN (char(unicode(substr(NEW.key, c.key + 1, 1))), char(65534), char(65535)));
END;

-- The same for an update of the key (the relay's own updates never
-- change it).
CREATE TRIGGER {prefix}outbox_key_text_update BEFORE UPDATE OF key ON {prefix}outbox
WHEN NEW.key IS NOT NULL
     AND (instr(CAST(NEW.key AS BLOB), x'00') > 0 OR NEW.key GLOB '*[^' || char(1) || '-' || char(127) || ']*')
BEGIN
    SELECT RAISE(ABORT, 'postbox: {prefix}outbox breaks {prefix}outbox_key_check: the key is not valid UTF-8 text, or holds a NUL byte')
    WHERE instr(CAST(NEW.key AS BLOB), x'00') > 0
       OR EXISTS (SELECT 1 FROM json_each('[' || rtrim(replace(hex(zeroblob(length(NEW.key))), '00', '0,'), ',') || ']') AS c
                  WHERE substr(NEW.key, c.key + 1, 1) NOT IN (char(unicode(substr(NEW.key, c.key + 1, 1))), char(65534), char(65535)));
END;
