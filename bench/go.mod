module github.com/postbox-go/postbox/bench

go 1.26.0

require (
	github.com/ThreeDotsLabs/watermill v1.5.1
	github.com/ThreeDotsLabs/watermill-nats/v2 v2.1.3
	github.com/ThreeDotsLabs/watermill-sql/v4 v4.1.2
	github.com/jackc/pgx/v5 v5.13.0
	github.com/nats-io/nats.go v1.56.0
	github.com/postbox-go/postbox v0.0.0-00010101000000-000000000000
	github.com/postbox-go/postbox/postboxnats v0.0.0-00010101000000-000000000000
	github.com/postbox-go/postbox/postboxpgx v0.0.0-00010101000000-000000000000
	gonum.org/v1/plot v0.17.0
)

require (
	codeberg.org/go-fonts/liberation v0.5.0 // indirect
	codeberg.org/go-latex/latex v0.2.0 // indirect
	codeberg.org/go-pdf/fpdf v0.11.1 // indirect
	git.sr.ht/~sbinet/gg v0.7.0 // indirect
	github.com/ajstarks/svgo v0.0.0-20211024235047-1546f124cd8b // indirect
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/golang/freetype v0.0.0-20170609003504-e2365dfdc4a0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/compress v1.20.4 // indirect
	github.com/lib/pq v1.10.9 // indirect
	github.com/lithammer/shortuuid/v3 v3.0.7 // indirect
	github.com/nats-io/nkeys v0.4.17 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/oklog/ulid v1.3.1 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/sony/gobreaker v1.0.0 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/image v0.30.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
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
	github.com/postbox-go/postbox/postboxotel => ../postboxotel
	github.com/postbox-go/postbox/postboxpgx => ../postboxpgx
	github.com/postbox-go/postbox/postboxprom => ../postboxprom
	github.com/postbox-go/postbox/postboxredis => ../postboxredis
	github.com/postbox-go/postbox/postboxschema => ../postboxschema
	github.com/postbox-go/postbox/postboxsql => ../postboxsql
	github.com/postbox-go/postbox/postboxsqlite => ../postboxsqlite
	github.com/postbox-go/postbox/postboxwebhook => ../postboxwebhook
)
