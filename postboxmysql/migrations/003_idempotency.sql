-- Idempotency-Key records of the HTTP middleware (package postboxidem), the
-- MySQL shape of the PostgreSQL table: one per key, SHA-256 of the method,
-- path, raw query, caller identity and the header value. A record is
-- claimed ("processing") in a statement of its own before the handler runs;
-- the handler's transaction then writes the response ("succeeded", whatever
-- its status) together with the handler's own rows, or the claim is
-- released ("failed") for a retry. Times are BIGINT unix milliseconds.
CREATE TABLE IF NOT EXISTS {prefix}idempotency (
    key_hash         BINARY(32)   NOT NULL PRIMARY KEY,
    fingerprint      BINARY(32)   NOT NULL, -- SHA-256 of the request body
    method           VARCHAR(16)  NOT NULL, -- descriptive only: lookups use key_hash
    path             TEXT         NOT NULL, -- descriptive only
    state            VARCHAR(16)  NOT NULL,
    claim_token      VARCHAR(64)  NOT NULL, -- fences the finalize and the release
    status           INT,
    headers          LONGTEXT,              -- the response headers kept for replay, JSON
    body             LONGBLOB,              -- NULL when too_large
    too_large        BOOLEAN      NOT NULL DEFAULT FALSE,
    created_at       BIGINT       NOT NULL,
    completed_at     BIGINT,
    expires_at       BIGINT       NOT NULL,
    claim_expires_at BIGINT       NOT NULL,
    KEY {prefix}idempotency_expires_at_idx (expires_at),
    CONSTRAINT {prefix}idempotency_state_check CHECK (state IN ('processing', 'succeeded', 'failed')),
    CONSTRAINT {prefix}idempotency_status_check CHECK (status IS NULL OR status BETWEEN 100 AND 999),
    CONSTRAINT {prefix}idempotency_headers_check CHECK (headers IS NULL OR (JSON_VALID(headers) AND JSON_TYPE(headers) = 'OBJECT')),
    -- A succeeded record can always be answered: a response to replay, or
    -- the too-large sentinel.
    CONSTRAINT {prefix}idempotency_succeeded_check CHECK (
        state <> 'succeeded' OR (status IS NOT NULL AND headers IS NOT NULL AND (body IS NOT NULL OR too_large))
    )
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
