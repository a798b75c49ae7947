module github.com/postbox-go/postbox/internal/natsembed

go 1.26.0

require (
	github.com/nats-io/nats-server/v2 v2.15.2
	github.com/nats-io/nats.go v1.56.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/antithesishq/antithesis-sdk-go v0.8.0-default-no-op // indirect
	github.com/google/go-tpm v0.9.8 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/minio/highwayhash v1.0.4 // indirect
	github.com/nats-io/jwt/v2 v2.8.2 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/stretchr/testify v1.12.1 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/time v0.16.0 // indirect
)

replace (
	github.com/postbox-go/postbox => ../..
	github.com/postbox-go/postbox/internal/sqlitetest => ../../internal/sqlitetest
	github.com/postbox-go/postbox/postboxadmin => ../../postboxadmin
	github.com/postbox-go/postbox/postboxamqp => ../../postboxamqp
	github.com/postbox-go/postbox/postboxidem => ../../postboxidem
	github.com/postbox-go/postbox/postboxkafka => ../../postboxkafka
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
