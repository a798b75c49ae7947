-- The inbox, as in PostgreSQL: one row per (consumer, message) a consumer's
-- handler committed, inserted in the handler's own transaction. keep_until
-- (unix milliseconds) holds a record past the consumer's own retention
-- while the producer's history can still replay its message (the
-- postbox-replay-horizon header); the largest BIGINT while it keeps its
-- history forever.
CREATE TABLE IF NOT EXISTS {prefix}inbox (
    consumer    VARCHAR(255) NOT NULL,
    message_id  VARCHAR(255) NOT NULL,
    received_at BIGINT       NOT NULL DEFAULT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000),
    keep_until  BIGINT,
    PRIMARY KEY (consumer, message_id),
    KEY {prefix}inbox_received_at_idx (received_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Failed handler runs, counted outside the handler's rolled-back
-- transaction; unsettled_runs counts the runs of redeliveries that began
-- and recorded no outcome yet (their process exited).
CREATE TABLE IF NOT EXISTS {prefix}inbox_attempts (
    consumer         VARCHAR(255) NOT NULL,
    message_id       VARCHAR(255) NOT NULL,
    attempts         INT          NOT NULL,
    first_failure_at BIGINT       NOT NULL DEFAULT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000),
    last_failure_at  BIGINT       NOT NULL DEFAULT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000),
    last_error       TEXT         NOT NULL,
    unsettled_runs   INT          NOT NULL DEFAULT 0,
    PRIMARY KEY (consumer, message_id),
    KEY {prefix}inbox_attempts_last_idx (last_failure_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Messages a consumer gave up on; requeue_requested_at marks those an
-- operator asked to requeue, which the consumer's running Inbox carries out.
CREATE TABLE IF NOT EXISTS {prefix}consumer_dead (
    consumer             VARCHAR(255) NOT NULL,
    message_id           VARCHAR(255) NOT NULL,
    topic                VARCHAR(255) NOT NULL,
    `key`                VARCHAR(255),
    payload              LONGBLOB     NOT NULL,
    headers              LONGTEXT     NOT NULL DEFAULT '{}',
    error                TEXT         NOT NULL,
    attempts             INT          NOT NULL,
    first_failure_at     BIGINT       NOT NULL,
    last_failure_at      BIGINT       NOT NULL,
    dead_at              BIGINT       NOT NULL DEFAULT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000),
    requeue_requested_at BIGINT,
    PRIMARY KEY (consumer, message_id),
    KEY {prefix}consumer_dead_topic_idx (consumer, topic, dead_at),
    KEY {prefix}consumer_dead_at_idx (dead_at),
    KEY {prefix}consumer_dead_requeue_idx (consumer, requeue_requested_at),
    CONSTRAINT {prefix}consumer_dead_headers_check CHECK (JSON_VALID(headers) AND JSON_TYPE(headers) = 'OBJECT')
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
