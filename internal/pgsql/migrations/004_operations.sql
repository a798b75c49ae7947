-- Every replay an operator asked for: who, which window, how many.
CREATE TABLE {prefix}replays (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    actor    text        NOT NULL,
    since    timestamptz NOT NULL,
    until    timestamptz NOT NULL,
    topic    text        NOT NULL DEFAULT '',
    key      text        NOT NULL DEFAULT '',
    count    integer     NOT NULL,
    dry_run  boolean     NOT NULL
);

-- Replay selects by creation time; rows enter the history roughly in
-- creation order, which a BRIN index serves at almost no write cost.
CREATE INDEX {prefix}published_created_at_idx ON {prefix}published USING brin (created_at);
CREATE INDEX {prefix}dead_dead_at_idx ON {prefix}dead (dead_at);
