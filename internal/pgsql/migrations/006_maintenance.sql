-- Claims on maintenance tasks that one process at a time runs, such as
-- the inbox retention pass: a task is taken when it is free, expired or
-- already the owner's, on the database clock, like a partition's lease.
CREATE TABLE {prefix}maintenance (
    task       text        PRIMARY KEY,
    owner      text,
    expires_at timestamptz NOT NULL DEFAULT '-infinity'
);
