SELECT pg_create_logical_replication_slot('s', 'pgoutput');
CREATE PUBLICATION p FOR TABLE bare;
DO $$ BEGIN FOR g IN 1..25600 LOOP INSERT INTO bare (id, topic, key, payload, headers) VALUES (gen_random_uuid(), 'orders.created', 'k' || (g % 1000), 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx', '{"ce-source": "/bench", "ce-time": "2026-12-01T22:20:01.123456789Z"}'); COMMIT; END LOOP; END $$;
CHECKPOINT;
