EXECUTE d('c1');
