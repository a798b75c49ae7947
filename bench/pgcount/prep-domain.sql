PREPARE d(text) AS INSERT INTO orders (customer, amount, status) VALUES ($1, 10, 'new');
