-- The producer's replay horizon (the postbox-replay-horizon header): an
-- inbox record is kept until keep_until (unix milliseconds) even past the
-- consumer's own retention, because the producer's history can still
-- replay its message until then; the largest integer while the producer
-- keeps its history forever. NULL, the usual case, leaves the record to
-- the consumer's retention.
ALTER TABLE {prefix}inbox ADD COLUMN keep_until INTEGER;
