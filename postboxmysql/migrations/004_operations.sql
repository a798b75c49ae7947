-- Every replay an operator asked for: who, which window, how many, and
-- whether as new messages (fresh ids, the original id in a header).
CREATE TABLE IF NOT EXISTS {prefix}replays (
    id      BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at      BIGINT       NOT NULL DEFAULT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000),
    actor   VARCHAR(255) NOT NULL,
    since   BIGINT       NOT NULL,
    until   BIGINT       NOT NULL,
    topic   VARCHAR(255) NOT NULL DEFAULT '',
    `key`   VARCHAR(255) NOT NULL DEFAULT '',
    count   BIGINT       NOT NULL,
    dry_run BOOLEAN      NOT NULL,
    as_new  BOOLEAN      NOT NULL DEFAULT FALSE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Claims on maintenance tasks that one process at a time runs, such as the
-- inbox retention pass: a task is taken when it is free, expired or already
-- the owner's, on the database clock, like a partition's lease.
CREATE TABLE IF NOT EXISTS {prefix}maintenance (
    task       VARCHAR(255) NOT NULL PRIMARY KEY,
    owner      VARCHAR(255),
    expires_at BIGINT       NOT NULL DEFAULT 0
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
