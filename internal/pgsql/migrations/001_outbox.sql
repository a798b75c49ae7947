-- The outbox holds pending rows only: a published row moves to the
-- published history, a dead one to the dead table. The hot table therefore
-- stays as small as the backlog, whatever the history holds.
CREATE TABLE {prefix}outbox (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id           uuid        NOT NULL,
    topic        text        NOT NULL,
    key          text,
    payload      bytea       NOT NULL,
    headers      jsonb       NOT NULL DEFAULT '{}',
    -- hash(key, or id when there is no key) mod 64, computed by the database
    -- so that writers in any language agree on it.
    partition    integer     NOT NULL GENERATED ALWAYS AS (
        ((('x' || substr(md5(coalesce(key, id::text)), 1, 8))::bit(32)::integer) & 2147483647) % 64
    ) STORED,
    created_at   timestamptz NOT NULL DEFAULT now(),
    available_at timestamptz NOT NULL DEFAULT now(),
    attempts     integer     NOT NULL DEFAULT 0,
    last_error   text,
    CONSTRAINT {prefix}outbox_id_key UNIQUE (id),
    CONSTRAINT {prefix}outbox_topic_check CHECK (topic ~ '^[A-Za-z0-9._:-]{1,255}$'),
    CONSTRAINT {prefix}outbox_key_check CHECK (key IS NULL OR octet_length(key) BETWEEN 1 AND 255),
    CONSTRAINT {prefix}outbox_headers_check CHECK (jsonb_typeof(headers) = 'object')
);

-- Rows that failed at least once: the only ones that can hold back a later
-- row of their key. Fresh rows never enter this index, so inserts do not pay
-- for it.
CREATE INDEX {prefix}outbox_retry_idx ON {prefix}outbox (key, seq) WHERE attempts > 0 AND key IS NOT NULL;

CREATE TABLE {prefix}published (
    seq          bigint      NOT NULL,
    id           uuid        NOT NULL,
    topic        text        NOT NULL,
    key          text,
    payload      bytea       NOT NULL,
    headers      jsonb       NOT NULL,
    partition    integer     NOT NULL,
    created_at   timestamptz NOT NULL,
    attempts     integer     NOT NULL,
    published_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX {prefix}published_id_idx ON {prefix}published (id);
CREATE INDEX {prefix}published_at_idx ON {prefix}published USING brin (published_at);

CREATE TABLE {prefix}dead (
    seq          bigint      PRIMARY KEY,
    id           uuid        NOT NULL,
    topic        text        NOT NULL,
    key          text,
    payload      bytea       NOT NULL,
    headers      jsonb       NOT NULL,
    partition    integer     NOT NULL,
    created_at   timestamptz NOT NULL,
    attempts     integer     NOT NULL,
    last_error   text,
    dead_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT {prefix}dead_id_key UNIQUE (id)
);
CREATE INDEX {prefix}dead_key_idx ON {prefix}dead (key, seq) WHERE key IS NOT NULL;

CREATE TABLE {prefix}leases (
    partition  integer     PRIMARY KEY,
    owner      text,
    generation bigint      NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL DEFAULT '-infinity'
) WITH (fillfactor = 50);
INSERT INTO {prefix}leases (partition) SELECT generate_series(0, 63);

CREATE TABLE {prefix}relays (
    id         text        PRIMARY KEY,
    started_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
) WITH (fillfactor = 50);
