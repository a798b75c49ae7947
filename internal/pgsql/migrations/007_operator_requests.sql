-- A requeue of a consumer's dead message that an operator asked for
-- (postbox consumer-dead requeue, the admin API): the consumer's running
-- Inbox, which has the handler, runs it through the inbox and removes the
-- dead message. The index holds only the requested ones.
ALTER TABLE {prefix}consumer_dead ADD COLUMN requeue_requested_at timestamptz;
CREATE INDEX {prefix}consumer_dead_requeue_idx ON {prefix}consumer_dead (consumer, requeue_requested_at)
    WHERE requeue_requested_at IS NOT NULL;

-- A replay as new messages (fresh ids, the original id in a header) is
-- audited as such.
ALTER TABLE {prefix}replays ADD COLUMN as_new boolean NOT NULL DEFAULT false;
