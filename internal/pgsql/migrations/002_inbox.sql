-- The inbox: one row per (consumer, message) that a consumer's handler
-- committed. Inserted in the handler's own transaction, so the effect and
-- the record commit together; a copy finds the row and runs no handler.
CREATE TABLE {prefix}inbox (
    consumer    text        NOT NULL,
    message_id  text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX {prefix}inbox_received_at_idx ON {prefix}inbox USING brin (received_at);

-- Failed handler runs, counted outside the handler's rolled-back
-- transaction, so the budget survives redeliveries and restarts.
CREATE TABLE {prefix}inbox_attempts (
    consumer         text        NOT NULL,
    message_id       text        NOT NULL,
    attempts         integer     NOT NULL,
    first_failure_at timestamptz NOT NULL DEFAULT now(),
    last_failure_at  timestamptz NOT NULL DEFAULT now(),
    last_error       text        NOT NULL,
    PRIMARY KEY (consumer, message_id)
);

-- Messages a consumer gave up on after its budget: everything needed to
-- run the handler again (requeue) or to understand why it failed.
CREATE TABLE {prefix}consumer_dead (
    consumer         text        NOT NULL,
    message_id       text        NOT NULL,
    topic            text        NOT NULL,
    key              text,
    payload          bytea       NOT NULL,
    headers          jsonb       NOT NULL DEFAULT '{}',
    error            text        NOT NULL,
    attempts         integer     NOT NULL,
    first_failure_at timestamptz NOT NULL,
    last_failure_at  timestamptz NOT NULL,
    dead_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX {prefix}consumer_dead_topic_idx ON {prefix}consumer_dead (consumer, topic, dead_at);
CREATE INDEX {prefix}consumer_dead_at_idx ON {prefix}consumer_dead (dead_at);
