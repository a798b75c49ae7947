PREPARE b(text, bytea, jsonb) AS INSERT INTO bare (id, topic, key, payload, headers) VALUES (gen_random_uuid(), 'orders.created', $1, $2, $3);
