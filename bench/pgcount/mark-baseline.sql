SELECT count(*) FROM (SELECT unnest(ARRAY(SELECT seq FROM n_outbox ORDER BY seq LIMIT 256)), (SELECT array_agg(1::bigint) FROM generate_series(1,64))) s;
