package warm
import (
 _ "github.com/jackc/pgx/v5/pgxpool"
 _ "github.com/jackc/pgx/v5/stdlib"
 _ "modernc.org/sqlite"
 _ "github.com/nats-io/nats.go/jetstream"
 _ "github.com/nats-io/nats-server/v2/server"
 _ "github.com/santhosh-tekuri/jsonschema/v6"
 _ "go.uber.org/goleak"
 _ "github.com/spf13/cobra"
 _ "github.com/google/uuid"
)
