SELECT (SELECT array_agg(1::bigint) FROM generate_series(1,64));
