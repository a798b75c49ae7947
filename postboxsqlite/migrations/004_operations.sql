-- Every replay an operator asked for: who, which window, how many.
CREATE TABLE {prefix}replays (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      INTEGER NOT NULL DEFAULT (CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)),
    actor   TEXT    NOT NULL,
    since   INTEGER NOT NULL,
    until   INTEGER NOT NULL,
    topic   TEXT    NOT NULL DEFAULT '',
    key     TEXT    NOT NULL DEFAULT '',
    count   INTEGER NOT NULL,
    dry_run INTEGER NOT NULL
) STRICT;

-- Replay selects the history by creation time.
CREATE INDEX {prefix}published_created_at_idx ON {prefix}published (created_at);
CREATE INDEX {prefix}dead_dead_at_idx ON {prefix}dead (dead_at);
