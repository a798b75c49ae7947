-- The SQLite shape of the PostgreSQL schema, table for table and column for
-- column. The outbox holds pending rows only: a published row moves to the
-- published history, a dead one to the dead table, so the hot table stays as
-- small as the backlog whatever the history holds.
--
-- Times are INTEGER unix milliseconds on the database clock. The expression
-- below is that clock; ROUND undoes the floating-point error of julianday,
-- which would otherwise truncate some instants one millisecond early.
--
-- STRICT tables reject values of the wrong type, as PostgreSQL's typed
-- columns do, instead of storing them with SQLite's loose affinity.
CREATE TABLE {prefix}outbox (
    -- AUTOINCREMENT: rows leave this table when they are published, and a
    -- plain rowid would number the next row after the largest one left,
    -- reusing the seqs of an emptied table. The published and dead tables
    -- and the order per key all rely on a seq never coming back.
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    -- A UUID in canonical lower-case form, as PostgreSQL prints uuid.
    id           TEXT    NOT NULL,
    topic        TEXT    NOT NULL,
    key          TEXT,
    payload      BLOB    NOT NULL,
    headers      TEXT    NOT NULL DEFAULT '{}',
    -- hash(key, or id when there is no key) mod 64: the first four bytes of
    -- md5 as a big-endian integer with the sign bit cleared. SQLite has no
    -- md5, so writers compute it (postboxdriver.PartitionOf in Go); writers
    -- in other languages must compute the same value.
    partition    INTEGER NOT NULL,
    created_at   INTEGER NOT NULL DEFAULT (CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)),
    available_at INTEGER NOT NULL DEFAULT (CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)),
    attempts     INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT,
    CONSTRAINT {prefix}outbox_id_key UNIQUE (id),
    CONSTRAINT {prefix}outbox_id_check CHECK (id GLOB '[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]'),
    -- The character check admits ASCII only, so length counts bytes here.
    CONSTRAINT {prefix}outbox_topic_check CHECK (length(topic) BETWEEN 1 AND 255 AND topic NOT GLOB '*[^A-Za-z0-9._:-]*'),
    CONSTRAINT {prefix}outbox_key_check CHECK (key IS NULL OR length(CAST(key AS BLOB)) BETWEEN 1 AND 255),
    CONSTRAINT {prefix}outbox_headers_check CHECK (json_valid(headers) AND json_type(headers) = 'object'),
    CONSTRAINT {prefix}outbox_partition_check CHECK (partition BETWEEN 0 AND 63)
) STRICT;

-- Rows that failed at least once: the only ones that can hold back a later
-- row of their key. Fresh rows never enter this index, so inserts do not pay
-- for it.
CREATE INDEX {prefix}outbox_retry_idx ON {prefix}outbox (key, seq) WHERE attempts > 0 AND key IS NOT NULL;

CREATE TABLE {prefix}published (
    seq          INTEGER NOT NULL,
    id           TEXT    NOT NULL,
    topic        TEXT    NOT NULL,
    key          TEXT,
    payload      BLOB    NOT NULL,
    headers      TEXT    NOT NULL,
    partition    INTEGER NOT NULL,
    created_at   INTEGER NOT NULL,
    attempts     INTEGER NOT NULL,
    published_at INTEGER NOT NULL DEFAULT (CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER))
) STRICT;
CREATE INDEX {prefix}published_id_idx ON {prefix}published (id);
-- Retention deletes by age; SQLite has no BRIN, so a plain index serves.
CREATE INDEX {prefix}published_at_idx ON {prefix}published (published_at);

CREATE TABLE {prefix}dead (
    seq          INTEGER PRIMARY KEY,
    id           TEXT    NOT NULL,
    topic        TEXT    NOT NULL,
    key          TEXT,
    payload      BLOB    NOT NULL,
    headers      TEXT    NOT NULL,
    partition    INTEGER NOT NULL,
    created_at   INTEGER NOT NULL,
    attempts     INTEGER NOT NULL,
    last_error   TEXT,
    dead_at      INTEGER NOT NULL DEFAULT (CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)),
    CONSTRAINT {prefix}dead_id_key UNIQUE (id)
) STRICT;
CREATE INDEX {prefix}dead_key_idx ON {prefix}dead (key, seq) WHERE key IS NOT NULL;

-- expires_at 0 (the epoch) stands for PostgreSQL's '-infinity': a lease
-- that was never taken is expired.
CREATE TABLE {prefix}leases (
    partition  INTEGER PRIMARY KEY,
    owner      TEXT,
    generation INTEGER NOT NULL DEFAULT 0,
    expires_at INTEGER NOT NULL DEFAULT 0
) STRICT;
WITH RECURSIVE p(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM p WHERE n < 63)
INSERT INTO {prefix}leases (partition) SELECT n FROM p;

CREATE TABLE {prefix}relays (
    id         TEXT    PRIMARY KEY,
    started_at INTEGER NOT NULL DEFAULT (CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)),
    expires_at INTEGER NOT NULL
) STRICT;
