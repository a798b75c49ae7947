SELECT count(*) FROM pg_logical_slot_get_binary_changes('s', NULL, NULL, 'proto_version', '1', 'publication_names', 'p', 'messages', 'true');
