-- The log read by snapshot bands (design §3, "The next storage model"):
-- its tables, so that every database at this version has them. No driver
-- writes them yet: postbox's writer and the relay keep the outbox, and a
-- writer in another language keeps inserting into the outbox under every
-- model (design §3, "What changes for users"), so this migration changes
-- nothing for anyone. The benchmark drains them through internal/pglog
-- (`postbox bench drain --storage log`).
--
-- {prefix}log holds every message the writer inserts, never updated. Its
-- xid comes first, so that its default assigns the writer's transaction id
-- before seq's nextval runs, and seq is drawn from the outbox's sequence,
-- so that the two tables' seqs compare (design §3, "The position"). The
-- writer supplies partition (postboxdriver.PartitionOf) and has applied
-- the table rules in Go, so the log carries neither the rules trigger nor
-- the CHECK constraints: only postbox's own writer inserts into it. It
-- cannot carry a unique index on id beside a split by seq, so it carries
-- none: a second row under an id reaches consumers as a redelivery does.
-- A BRIN index on created_at serves a replay's window: rows are appended
-- about in creation order, and the index costs a write next to nothing.
CREATE TABLE {prefix}log (
    xid        xid8        NOT NULL DEFAULT pg_current_xact_id(),
    seq        bigint      NOT NULL DEFAULT nextval('{prefix}outbox_seq_seq'),
    id         uuid        NOT NULL,
    topic      text        NOT NULL,
    key        text,
    payload    bytea       NOT NULL,
    headers    jsonb       NOT NULL,
    partition  integer     NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition, seq)
);
CREATE INDEX {prefix}log_xid_idx ON {prefix}log (xid);
CREATE INDEX {prefix}log_created_idx ON {prefix}log USING brin (created_at);

-- {prefix}positions holds each partition's position: every committed log
-- row visible in lo is done; one not visible was written by a transaction
-- that had its id when lo was taken (in its xip list, or at least its xmax
-- and below lo_next), or got it later and so drew a seq above lo_seq. An
-- open band (hi set) is being read in seq order up to band_cursor, and
-- band_max is the largest seq read in it. A position starts at '1:1:', a
-- snapshot in which nothing is visible: the log from its beginning. Not
-- columns of the leases: a batch's record then reads the lease to fence
-- itself and locks nothing the relays' renewals write.
CREATE TABLE {prefix}positions (
    partition   integer     PRIMARY KEY,
    lo          pg_snapshot NOT NULL DEFAULT '1:1:',
    lo_next     xid8        NOT NULL DEFAULT '1',
    lo_seq      bigint      NOT NULL DEFAULT 0,
    hi          pg_snapshot,
    hi_next     xid8,
    band_cursor bigint      NOT NULL DEFAULT 0,
    band_max    bigint      NOT NULL DEFAULT 0
);
INSERT INTO {prefix}positions (partition) SELECT partition FROM {prefix}leases;

-- {prefix}log_done marks the log rows recorded one by one, by a record
-- that names rows of no read of its process's (design §3, "The seam"):
-- reads hand them to no one and move the position past them, and the
-- record that does deletes the mark. Empty in steady state.
CREATE TABLE {prefix}log_done (
    partition integer NOT NULL,
    seq       bigint  NOT NULL,
    PRIMARY KEY (partition, seq)
);

-- {prefix}log_passes is the log's history of publishing, a row a record:
-- what it published by topic (how many, and the oldest's creation time),
-- and the positions it moved of the partitions it passed rows of, each
-- partition at most once a second. A log row was published by a time T
-- when the position its partition had at T passed it (design §3,
-- "History and retention").
CREATE TABLE {prefix}log_passes (
    at      timestamptz   NOT NULL DEFAULT now(),
    parts   integer[]     NOT NULL,
    lo      text[]        NOT NULL,
    lo_seq  bigint[]      NOT NULL,
    hi      text[]        NOT NULL,
    cursors bigint[]      NOT NULL,
    topics  text[]        NOT NULL,
    counts  integer[]     NOT NULL,
    oldest  timestamptz[] NOT NULL
);
CREATE INDEX {prefix}log_passes_at_idx ON {prefix}log_passes (at);
