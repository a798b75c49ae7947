SELECT pg_create_logical_replication_slot('s', 'pgoutput');
CREATE PUBLICATION p FOR TABLE bare;
DO $$ BEGIN FOR t IN 1..100 LOOP FOR g IN 1..256 LOOP PERFORM pg_logical_emit_message(true, 'postbox', E'0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b\\000orders.created\\000k1\\000{"ce-source": "/bench", "ce-time": "2026-12-01T22:20:01.123456789Z"}\\000xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'::bytea); END LOOP; COMMIT; END LOOP; END $$;
CHECKPOINT;
