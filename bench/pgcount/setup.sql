CREATE TABLE orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer text NOT NULL, amount numeric NOT NULL, status text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE bare (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id uuid NOT NULL, topic text NOT NULL, key text, payload bytea NOT NULL, headers jsonb NOT NULL DEFAULT '{}', created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE backlog (LIKE n_outbox INCLUDING ALL);
UPDATE n_leases SET owner = 'r', generation = 1, expires_at = now() + interval '1 day';
INSERT INTO backlog (id, topic, key, payload, headers, partition)
SELECT gen_random_uuid(), 'orders.created', 'k' || (g % 1000), convert_to(repeat('x', 256), 'UTF8'),
       '{"ce-source": "/bench", "ce-time": "2026-12-01T22:20:01.123456789Z"}', g % 64
FROM generate_series(1, 25600) g;
INSERT INTO n_outbox (id, topic, key, payload, headers, partition) SELECT id, topic, key, payload, headers, partition FROM backlog ORDER BY seq;
CREATE TABLE logt (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id uuid NOT NULL, topic text NOT NULL, key text, payload bytea NOT NULL, headers jsonb NOT NULL, partition int NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
INSERT INTO logt (id, topic, key, payload, headers, partition) SELECT id, topic, key, payload, headers, partition FROM backlog ORDER BY seq;
DROP TABLE backlog;
CREATE TABLE pos (partition int PRIMARY KEY, pos bigint NOT NULL DEFAULT 0) WITH (fillfactor = 50);
INSERT INTO pos (partition) SELECT generate_series(0, 63);
VACUUM ANALYZE;
