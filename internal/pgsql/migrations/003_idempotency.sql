-- Idempotency-Key records of the HTTP middleware (package postboxidem), one
-- per key: SHA-256 of the method, path, raw query, caller identity and the
-- header value. Shared by every replica of a service, so a retry that lands
-- on another replica finds the first request's claim or its response.
--
-- A record is claimed ("processing") in a short transaction of its own
-- before the handler runs; the handler's transaction then writes the
-- response ("succeeded", whatever its status) together with the handler's
-- own rows, or the claim is released ("failed") for a retry. A claim whose
-- server died is taken over once claim_expires_at has passed.
CREATE TABLE {prefix}idempotency (
    key_hash         bytea       PRIMARY KEY,
    fingerprint      bytea       NOT NULL, -- SHA-256 of the request body
    method           text        NOT NULL, -- descriptive only: lookups use key_hash
    path             text        NOT NULL, -- descriptive only
    state            text        NOT NULL,
    claim_token      uuid        NOT NULL, -- fences the finalize and the release
    status           integer,
    headers          jsonb,                -- the response headers kept for replay
    body             bytea,                -- NULL when too_large
    too_large        boolean     NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    expires_at       timestamptz NOT NULL,
    claim_expires_at timestamptz NOT NULL,
    CONSTRAINT {prefix}idempotency_key_hash_check CHECK (octet_length(key_hash) = 32),
    CONSTRAINT {prefix}idempotency_fingerprint_check CHECK (octet_length(fingerprint) = 32),
    CONSTRAINT {prefix}idempotency_state_check CHECK (state IN ('processing', 'succeeded', 'failed')),
    CONSTRAINT {prefix}idempotency_status_check CHECK (status IS NULL OR status BETWEEN 100 AND 999),
    CONSTRAINT {prefix}idempotency_headers_check CHECK (headers IS NULL OR jsonb_typeof(headers) = 'object'),
    -- A succeeded record can always be answered: a response to replay, or
    -- the too-large sentinel.
    CONSTRAINT {prefix}idempotency_succeeded_check CHECK (
        state <> 'succeeded' OR (status IS NOT NULL AND headers IS NOT NULL AND (body IS NOT NULL OR too_large))
    )
);
-- Clean-up deletes by age in bounded batches.
CREATE INDEX {prefix}idempotency_expires_at_idx ON {prefix}idempotency (expires_at);
