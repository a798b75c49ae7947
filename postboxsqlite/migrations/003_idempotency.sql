-- Idempotency-Key records of the HTTP middleware (package postboxidem), the
-- SQLite shape of the PostgreSQL table: one per key, SHA-256 of the method,
-- path, raw query, caller identity and the header value.
--
-- A record is claimed ("processing") in a statement of its own before the
-- handler runs; the handler's transaction then writes the response
-- ("succeeded", whatever its status) together with the handler's own rows,
-- or the claim is released ("failed") for a retry. A claim whose server
-- died is taken over once claim_expires_at has passed.
--
-- Times are INTEGER unix milliseconds on the database clock. A rowid table
-- (not WITHOUT ROWID): a row can hold a response body of up to a MiB.
CREATE TABLE {prefix}idempotency (
    key_hash         BLOB    PRIMARY KEY,
    fingerprint      BLOB    NOT NULL, -- SHA-256 of the request body
    method           TEXT    NOT NULL, -- descriptive only: lookups use key_hash
    path             TEXT    NOT NULL, -- descriptive only
    state            TEXT    NOT NULL,
    claim_token      TEXT    NOT NULL, -- fences the finalize and the release
    status           INTEGER,
    headers          TEXT,             -- the response headers kept for replay, JSON
    body             BLOB,             -- NULL when too_large
    too_large        INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL DEFAULT (CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)),
    completed_at     INTEGER,
    expires_at       INTEGER NOT NULL,
    claim_expires_at INTEGER NOT NULL,
    CONSTRAINT {prefix}idempotency_key_hash_check CHECK (typeof(key_hash) = 'blob' AND length(key_hash) = 32),
    CONSTRAINT {prefix}idempotency_fingerprint_check CHECK (length(fingerprint) = 32),
    CONSTRAINT {prefix}idempotency_state_check CHECK (state IN ('processing', 'succeeded', 'failed')),
    CONSTRAINT {prefix}idempotency_status_check CHECK (status IS NULL OR status BETWEEN 100 AND 999),
    CONSTRAINT {prefix}idempotency_headers_check CHECK (headers IS NULL OR (json_valid(headers) AND json_type(headers) = 'object')),
    CONSTRAINT {prefix}idempotency_too_large_check CHECK (too_large IN (0, 1)),
    -- A succeeded record can always be answered: a response to replay, or
    -- the too-large sentinel.
    CONSTRAINT {prefix}idempotency_succeeded_check CHECK (
        state <> 'succeeded' OR (status IS NOT NULL AND headers IS NOT NULL AND (body IS NOT NULL OR too_large = 1))
    )
) STRICT;
-- Clean-up deletes by age in bounded batches.
CREATE INDEX {prefix}idempotency_expires_at_idx ON {prefix}idempotency (expires_at);
