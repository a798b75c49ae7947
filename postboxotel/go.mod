module github.com/postbox-go/postbox/postboxotel

go 1.26.0

require (
	github.com/jackc/pgx/v5 v5.12.0
	github.com/postbox-go/postbox v0.0.0-00010101000000-000000000000
	github.com/postbox-go/postbox/postboxpgx v0.0.0-00010101000000-000000000000
	go.opentelemetry.io/otel v1.47.0
	go.opentelemetry.io/otel/sdk v1.47.0
	go.opentelemetry.io/otel/trace v1.47.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)

replace (
	github.com/postbox-go/postbox => ..
	github.com/postbox-go/postbox/internal/natsembed => ../internal/natsembed
	github.com/postbox-go/postbox/internal/sqlitetest => ../internal/sqlitetest
	github.com/postbox-go/postbox/postboxadmin => ../postboxadmin
	github.com/postbox-go/postbox/postboxamqp => ../postboxamqp
	github.com/postbox-go/postbox/postboxidem => ../postboxidem
	github.com/postbox-go/postbox/postboxkafka => ../postboxkafka
	github.com/postbox-go/postbox/postboxnats => ../postboxnats
	github.com/postbox-go/postbox/postboxpgx => ../postboxpgx
	github.com/postbox-go/postbox/postboxprom => ../postboxprom
	github.com/postbox-go/postbox/postboxredis => ../postboxredis
	github.com/postbox-go/postbox/postboxschema => ../postboxschema
	github.com/postbox-go/postbox/postboxsql => ../postboxsql
	github.com/postbox-go/postbox/postboxsqlite => ../postboxsqlite
	github.com/postbox-go/postbox/postboxwebhook => ../postboxwebhook
)
