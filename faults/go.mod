module github.com/postbox-go/postbox/faults

go 1.26.0

require (
	github.com/jackc/pgx/v5 v5.12.0
	github.com/nats-io/nats.go v1.56.0
	github.com/postbox-go/postbox v0.0.0-00010101000000-000000000000
	github.com/postbox-go/postbox/postboxamqp v0.0.0-00010101000000-000000000000
	github.com/postbox-go/postbox/postboxmysql v0.0.0-00010101000000-000000000000
	github.com/postbox-go/postbox/postboxnats v0.0.0-00010101000000-000000000000
	github.com/postbox-go/postbox/postboxpgx v0.0.0-00010101000000-000000000000
	github.com/rabbitmq/amqp091-go v1.16.0
)

require (
	filippo.io/edwards25519 v1.1.0 // indirect
	github.com/go-sql-driver/mysql v1.9.3 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
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
	github.com/postbox-go/postbox/postboxmysql => ../postboxmysql
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
