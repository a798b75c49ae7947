-- Crash-looping messages (design §4, "A message that kills the relay").
--
-- leases.crashed: the partition's owner took it after the previous owner's
-- lease ran out (not a release), so that owner may have died publishing
-- one of its rows. The new owner then publishes the partition's first rows
-- with marks.
--
-- outbox.inflight: the mark such a publish leaves while it runs: 0 none,
-- 1 in flight among others, 2 in flight alone, 3 suspected (it was in
-- flight among others when a relay died); outbox.inflight_by: the relay
-- that marked it, whose heartbeat tells a death from a pause. outbox.crashes:
-- how many relays died while the row was in flight alone. Rows published without marks
-- (every partition not taken after an expiry) never write either.
ALTER TABLE {prefix}leases ADD COLUMN crashed INTEGER NOT NULL DEFAULT 0 CHECK (crashed IN (0, 1));
ALTER TABLE {prefix}outbox ADD COLUMN inflight INTEGER NOT NULL DEFAULT 0 CHECK (inflight BETWEEN 0 AND 3);
ALTER TABLE {prefix}outbox ADD COLUMN inflight_by TEXT;
ALTER TABLE {prefix}outbox ADD COLUMN crashes INTEGER NOT NULL DEFAULT 0 CHECK (crashes >= 0);
