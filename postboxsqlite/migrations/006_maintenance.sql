-- Claims on maintenance tasks that one process at a time runs, such as
-- the inbox retention pass: a task is taken when it is free, expired or
-- already the owner's, on the database clock, like a partition's lease.
-- expires_at is unix milliseconds; 0 is long past.
CREATE TABLE {prefix}maintenance (
    task       TEXT    PRIMARY KEY,
    owner      TEXT,
    expires_at INTEGER NOT NULL DEFAULT 0
) STRICT;
