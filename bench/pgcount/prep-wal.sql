PREPARE d(text) AS INSERT INTO orders (customer, amount, status) VALUES ($1, 10, 'new');
PREPARE b(text, bytea, jsonb) AS INSERT INTO bare (id, topic, key, payload, headers) VALUES (gen_random_uuid(), 'orders.created', $1, $2, $3);
PREPARE u(uuid, text, text, bytea, jsonb, int) AS INSERT INTO n_outbox (id, topic, key, payload, headers, partition) VALUES ($1, $2, $3, $4, $5, $6);
PREPARE l(uuid, text, text, bytea, jsonb, int) AS INSERT INTO slog (id, topic, key, payload, headers, partition) VALUES ($1, $2, $3, $4, $5, $6);
PREPARE e(bytea) AS SELECT pg_logical_emit_message(true, 'postbox', $1);
