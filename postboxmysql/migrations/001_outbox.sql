-- The MySQL and MariaDB shape of the PostgreSQL schema, table for table and
-- column for column. The outbox holds pending rows only: a published row
-- moves to the published history, a dead one to the dead table, so the hot
-- table stays as small as the backlog whatever the history holds.
--
-- Times are BIGINT unix milliseconds on the database clock, read as
-- TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000: UTC
-- whatever the session's time_zone, and fixed for one statement.
--
-- Text is utf8mb4 with the binary collation: keys, topics and ids compare
-- byte for byte, as in PostgreSQL, never case-insensitively.
--
-- `key` and `partition` are reserved words here and are quoted.
--
-- Every statement is idempotent (IF NOT EXISTS, INSERT IGNORE): MySQL
-- commits DDL at once, so a migration cut short is run again whole.
CREATE TABLE IF NOT EXISTS {prefix}outbox (
    -- InnoDB keeps the AUTO_INCREMENT counter across restarts (MySQL 8.0,
    -- MariaDB 10.6 and later), so an emptied table never hands out a seq
    -- again: the published and dead tables and the order per key rely on
    -- it.
    seq          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    -- A UUID in canonical lower-case form, as PostgreSQL prints uuid.
    id           VARCHAR(36)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    topic        VARCHAR(1024) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    `key`        VARCHAR(766),
    payload      LONGBLOB     NOT NULL,
    headers      LONGTEXT     NOT NULL DEFAULT '{}',
    -- hash(key, or id when there is no key) mod 64: the first four bytes of
    -- md5 as a big-endian integer with the sign bit cleared, computed by
    -- the server for every writer, as postboxdriver.PartitionOf does in Go.
    `partition`  INT AS ((CAST(CONV(LEFT(MD5(COALESCE(`key`, id)), 8), 16, 10) AS UNSIGNED) & 2147483647) % 64) STORED,
    created_at   BIGINT       NOT NULL DEFAULT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000),
    available_at BIGINT       NOT NULL DEFAULT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000),
    attempts     INT          NOT NULL DEFAULT 0,
    last_error   TEXT,
    -- Crash marks (design §4, "A message that kills the relay"): 0 none,
    -- 1 in flight among others, 2 in flight alone, 3 suspected; the relay
    -- that marked the row; the relays that died with it in flight alone.
    inflight     TINYINT      NOT NULL DEFAULT 0,
    inflight_by  VARCHAR(255),
    crashes      INT          NOT NULL DEFAULT 0,
    -- The key of a row that failed at least once: the only rows that can
    -- hold back a later row of their key. NULL for fresh rows, so that the
    -- index below holds only those and inserts pay little for it (MySQL
    -- has no partial index).
    retry_key    VARCHAR(766) AS (IF(attempts > 0, `key`, NULL)) VIRTUAL,
    -- Set by postbox's own writer, which checked the row against the
    -- table's rules in Go: the insert trigger (migration 5) then skips
    -- them. Writers in other languages leave it out and are checked.
    checked      BOOLEAN      NOT NULL DEFAULT FALSE,
    UNIQUE KEY {prefix}outbox_id_key (id),
    KEY {prefix}outbox_partition_idx (`partition`, seq),
    KEY {prefix}outbox_retry_idx (retry_key, seq),
    CONSTRAINT {prefix}outbox_id_check CHECK (id REGEXP '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'),
    CONSTRAINT {prefix}outbox_topic_check CHECK (CHAR_LENGTH(topic) BETWEEN 1 AND 255 AND topic REGEXP '^[A-Za-z0-9._:-]+$'),
    CONSTRAINT {prefix}outbox_key_check CHECK (`key` IS NULL OR OCTET_LENGTH(`key`) BETWEEN 1 AND 255),
    CONSTRAINT {prefix}outbox_headers_check CHECK (JSON_VALID(headers) AND JSON_TYPE(headers) = 'OBJECT'),
    CONSTRAINT {prefix}outbox_inflight_check CHECK (inflight BETWEEN 0 AND 3),
    CONSTRAINT {prefix}outbox_crashes_check CHECK (crashes >= 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {prefix}published (
    seq          BIGINT       NOT NULL PRIMARY KEY,
    id           VARCHAR(36)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    topic        VARCHAR(1024) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    `key`        VARCHAR(766),
    payload      LONGBLOB     NOT NULL,
    headers      LONGTEXT     NOT NULL,
    `partition`  INT          NOT NULL,
    created_at   BIGINT       NOT NULL,
    attempts     INT          NOT NULL,
    published_at BIGINT       NOT NULL,
    KEY {prefix}published_id_idx (id),
    KEY {prefix}published_at_idx (published_at),
    -- Replay selects the history by creation time.
    KEY {prefix}published_created_at_idx (created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {prefix}dead (
    seq          BIGINT       NOT NULL PRIMARY KEY,
    id           VARCHAR(36)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    topic        VARCHAR(1024) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    `key`        VARCHAR(766),
    payload      LONGBLOB     NOT NULL,
    headers      LONGTEXT     NOT NULL,
    `partition`  INT          NOT NULL,
    created_at   BIGINT       NOT NULL,
    attempts     INT          NOT NULL,
    last_error   TEXT,
    dead_at      BIGINT       NOT NULL,
    UNIQUE KEY {prefix}dead_id_key (id),
    KEY {prefix}dead_key_idx (`key`, seq),
    KEY {prefix}dead_dead_at_idx (dead_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- expires_at 0 (the epoch) stands for PostgreSQL's '-infinity': a lease
-- that was never taken is expired. crashed: the owner took the partition
-- after the previous owner's lease ran out, so that owner may have died
-- publishing one of its rows.
CREATE TABLE IF NOT EXISTS {prefix}leases (
    `partition` INT          NOT NULL PRIMARY KEY,
    owner       VARCHAR(255),
    generation  BIGINT       NOT NULL DEFAULT 0,
    expires_at  BIGINT       NOT NULL DEFAULT 0,
    crashed     BOOLEAN      NOT NULL DEFAULT FALSE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

INSERT IGNORE INTO {prefix}leases (`partition`)
SELECT n FROM JSON_TABLE('[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60,61,62,63]',
    '$[*]' COLUMNS (n INT PATH '$')) AS p;

CREATE TABLE IF NOT EXISTS {prefix}relays (
    id         VARCHAR(255) NOT NULL PRIMARY KEY,
    started_at BIGINT       NOT NULL DEFAULT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000),
    expires_at BIGINT       NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
