-- Handler runs of redeliveries that began and have recorded no outcome yet
-- since the message's last one (a failure, or a settled retry): runs whose
-- process exited before the handler returned. A first delivery writes
-- nothing here; the inbox counts a run only when the broker says it is a
-- redelivery, and dead-letters the message once the count reaches
-- Config.MaxCrashes.
ALTER TABLE {prefix}inbox_attempts ADD COLUMN unsettled_runs integer NOT NULL DEFAULT 0;
