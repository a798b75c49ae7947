-- What the database's relays read (design §3, "Switching a database to
-- the log"): table, the outbox, or log, the log of migration 12 with the
-- outbox beside it. The database holds the setting, one row, and each
-- relay registers its own with its heartbeat, so that a switch can be
-- guarded against the relays that run:
--
-- - a switch to the log (`postbox storage log`) is refused while a live
--   relay reads the table, since such a relay never reads the log;
-- - a relay over the table is refused, at its start and at each heartbeat,
--   while the database says log, and at its start while the log holds a
--   row no position has passed;
-- - a relay over the log runs under either setting: it reads both.
--
-- The log's writer writes the log only while this says log, the outbox
-- otherwise, reading it in its insert statement. The switch locks this
-- table, which every heartbeat and every such write reads, so that no
-- heartbeat registers a relay over the table between the switch's check
-- of the relays and its commit, and no write that read the old setting
-- is still open once it has committed. Every database starts on the
-- table, as it ran before this migration; the drivers' writers keep the
-- outbox, which every relay reads.
CREATE TABLE {prefix}storage (
    only_row   boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    storage    text        NOT NULL CHECK (storage IN ('table', 'log')),
    changed_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {prefix}storage (storage) VALUES ('table');

ALTER TABLE {prefix}relays ADD COLUMN storage text NOT NULL DEFAULT 'table' CHECK (storage IN ('table', 'log'));
