PREPARE u(uuid, text, text, bytea, jsonb, int) AS INSERT INTO slog (id, topic, key, payload, headers, partition) VALUES ($1, $2, $3, $4, $5, $6);
