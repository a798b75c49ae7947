module github.com/postbox-go/postbox/cmd/postbox

go 1.26.0

require (
	github.com/chromedp/chromedp v0.23.0
	github.com/goccy/go-yaml v1.19.2
	github.com/jackc/pgx/v5 v5.12.0
	github.com/nats-io/nats-server/v2 v2.15.2
	github.com/nats-io/nats.go v1.56.0
	github.com/postbox-go/postbox v0.0.0-00010101000000-000000000000
	github.com/postbox-go/postbox/internal/mysqltest v0.0.0-00010101000000-000000000000
	github.com/postbox-go/postbox/internal/natsembed v0.0.0-00010101000000-000000000000
	github.com/postbox-go/postbox/postboxadmin v0.0.0-00010101000000-000000000000
	github.com/postbox-go/postbox/postboxamqp v0.0.0-00010101000000-000000000000
	github.com/postbox-go/postbox/postboxkafka v0.0.0-00010101000000-000000000000
	github.com/postbox-go/postbox/postboxmysql v0.0.0-00010101000000-000000000000
	github.com/postbox-go/postbox/postboxnats v0.0.0-00010101000000-000000000000
	github.com/postbox-go/postbox/postboxpgx v0.0.0-00010101000000-000000000000
	github.com/postbox-go/postbox/postboxprom v0.0.0-00010101000000-000000000000
	github.com/postbox-go/postbox/postboxredis v0.0.0-00010101000000-000000000000
	github.com/postbox-go/postbox/postboxsqlite v0.0.0-00010101000000-000000000000
	github.com/postbox-go/postbox/postboxwebhook v0.0.0-00010101000000-000000000000
	github.com/prometheus/client_golang v1.25.0
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/spf13/cobra v1.10.2
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
	go.uber.org/goleak v1.3.0
	modernc.org/sqlite v1.62.0
)

require (
	filippo.io/edwards25519 v1.1.0 // indirect
	github.com/antithesishq/antithesis-sdk-go v0.8.0-default-no-op // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/chromedp/cdproto v0.159.0 // indirect
	github.com/dustin/go-humanize v1.1.0 // indirect
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
	github.com/go-sql-driver/mysql v1.9.3 // indirect
	github.com/google/go-tpm v0.9.8 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/minio/highwayhash v1.0.4 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/nats-io/jwt/v2 v2.8.2 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	github.com/twmb/franz-go/pkg/kmsg v1.15.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	golang.org/x/time v0.16.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
	modernc.org/libc v1.80.1 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
)

replace (
	github.com/postbox-go/postbox => ../..
	github.com/postbox-go/postbox/internal/mysqltest => ../../internal/mysqltest
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
