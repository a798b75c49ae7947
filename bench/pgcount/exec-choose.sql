SELECT set_config('pb.s', ARRAY(SELECT seq FROM n_outbox ORDER BY seq LIMIT 256)::text, false);
