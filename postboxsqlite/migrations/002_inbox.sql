-- The inbox, as in PostgreSQL: one row per (consumer, message) a consumer's
-- handler committed, inserted in the handler's own transaction.
CREATE TABLE {prefix}inbox (
    consumer    TEXT    NOT NULL,
    message_id  TEXT    NOT NULL,
    received_at INTEGER NOT NULL DEFAULT (CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)),
    PRIMARY KEY (consumer, message_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX {prefix}inbox_received_at_idx ON {prefix}inbox (received_at);

-- Failed handler runs, counted outside the handler's rolled-back transaction.
CREATE TABLE {prefix}inbox_attempts (
    consumer         TEXT    NOT NULL,
    message_id       TEXT    NOT NULL,
    attempts         INTEGER NOT NULL,
    first_failure_at INTEGER NOT NULL DEFAULT (CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)),
    last_failure_at  INTEGER NOT NULL DEFAULT (CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)),
    last_error       TEXT    NOT NULL,
    PRIMARY KEY (consumer, message_id)
) STRICT, WITHOUT ROWID;

-- Messages a consumer gave up on after its budget.
CREATE TABLE {prefix}consumer_dead (
    consumer         TEXT    NOT NULL,
    message_id       TEXT    NOT NULL,
    topic            TEXT    NOT NULL,
    key              TEXT,
    payload          BLOB    NOT NULL,
    headers          TEXT    NOT NULL DEFAULT '{}',
    error            TEXT    NOT NULL,
    attempts         INTEGER NOT NULL,
    first_failure_at INTEGER NOT NULL,
    last_failure_at  INTEGER NOT NULL,
    dead_at          INTEGER NOT NULL DEFAULT (CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)),
    PRIMARY KEY (consumer, message_id),
    CONSTRAINT {prefix}consumer_dead_headers_check CHECK (json_valid(headers) AND json_type(headers) = 'object')
) STRICT;
CREATE INDEX {prefix}consumer_dead_topic_idx ON {prefix}consumer_dead (consumer, topic, dead_at);
CREATE INDEX {prefix}consumer_dead_at_idx ON {prefix}consumer_dead (dead_at);
