PREPARE u(uuid, text, text, bytea, jsonb) AS INSERT INTO n_outbox (id, topic, key, payload, headers) VALUES ($1, $2, $3, $4, $5);
