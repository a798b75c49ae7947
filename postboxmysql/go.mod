module github.com/postbox-go/postbox/postboxmysql

go 1.26.0

require (
	github.com/go-sql-driver/mysql v1.9.3
	github.com/postbox-go/postbox v0.0.0-00010101000000-000000000000
	github.com/postbox-go/postbox/internal/mysqltest v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
)

require (
	filippo.io/edwards25519 v1.1.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.12.0 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/postbox-go/postbox/postboxpgx v0.0.0-00010101000000-000000000000 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)

replace (
	github.com/postbox-go/postbox => ..
	github.com/postbox-go/postbox/internal/mysqltest => ../internal/mysqltest
	github.com/postbox-go/postbox/internal/natsembed => ../internal/natsembed
	github.com/postbox-go/postbox/internal/sqlitetest => ../internal/sqlitetest
	github.com/postbox-go/postbox/postboxadmin => ../postboxadmin
	github.com/postbox-go/postbox/postboxamqp => ../postboxamqp
	github.com/postbox-go/postbox/postboxidem => ../postboxidem
	github.com/postbox-go/postbox/postboxkafka => ../postboxkafka
	github.com/postbox-go/postbox/postboxnats => ../postboxnats
	github.com/postbox-go/postbox/postboxotel => ../postboxotel
	github.com/postbox-go/postbox/postboxpgx => ../postboxpgx
	github.com/postbox-go/postbox/postboxprom => ../postboxprom
	github.com/postbox-go/postbox/postboxredis => ../postboxredis
	github.com/postbox-go/postbox/postboxschema => ../postboxschema
	github.com/postbox-go/postbox/postboxsql => ../postboxsql
	github.com/postbox-go/postbox/postboxsqlite => ../postboxsqlite
	github.com/postbox-go/postbox/postboxwebhook => ../postboxwebhook
)
