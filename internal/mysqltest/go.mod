module github.com/postbox-go/postbox/internal/mysqltest

go 1.26.0

require (
	github.com/postbox-go/postbox v0.0.0-00010101000000-000000000000
	github.com/postbox-go/postbox/postboxmysql v0.0.0-00010101000000-000000000000
)

require (
	filippo.io/edwards25519 v1.1.0 // indirect
	github.com/go-sql-driver/mysql v1.9.3 // indirect
	github.com/google/uuid v1.6.0 // indirect
)

replace (
	github.com/postbox-go/postbox => ../..
	github.com/postbox-go/postbox/internal/natsembed => ../../internal/natsembed
	github.com/postbox-go/postbox/internal/sqlitetest => ../../internal/sqlitetest
	github.com/postbox-go/postbox/postboxadmin => ../../postboxadmin
	github.com/postbox-go/postbox/postboxamqp => ../../postboxamqp
	github.com/postbox-go/postbox/postboxidem => ../../postboxidem
	github.com/postbox-go/postbox/postboxkafka => ../../postboxkafka
	github.com/postbox-go/postbox/postboxmysql => ../../postboxmysql
	github.com/postbox-go/postbox/postboxnats => ../../postboxnats
	github.com/postbox-go/postbox/postboxotel => ../../postboxotel
	github.com/postbox-go/postbox/postboxpgx => ../../postboxpgx
	github.com/postbox-go/postbox/postboxprom => ../../postboxprom
	github.com/postbox-go/postbox/postboxredis => ../../postboxredis
	github.com/postbox-go/postbox/postboxschema => ../../postboxschema
	github.com/postbox-go/postbox/postboxsql => ../../postboxsql
	github.com/postbox-go/postbox/postboxsqlite => ../../postboxsqlite
	github.com/postbox-go/postbox/postboxwebhook => ../../postboxwebhook
)
