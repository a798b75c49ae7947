package relayd

import (
	"database/sql"
	"fmt"
	"strings"

	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxmysql"
	"github.com/postbox-go/postbox/postboxsqlite"
)

// URLForms names the database URLs postbox accepts, for messages.
const URLForms = "postgres://..., mysql://user@host:3306/dbname or sqlite:PATH"

// The kinds of database a URL names (URLKind).
const (
	KindPostgres = "postgres"
	KindMySQL    = "mysql"
	KindSQLite   = "sqlite"
)

// URLKind names the database a URL is for, or "" for none postbox knows.
func URLKind(u string) string {
	switch {
	case strings.HasPrefix(u, "postgres://"), strings.HasPrefix(u, "postgresql://"):
		return KindPostgres
	case strings.HasPrefix(u, "mysql://") && len(u) > len("mysql://"):
		return KindMySQL
	case strings.HasPrefix(u, "sqlite:") && len(u) > len("sqlite:"):
		return KindSQLite
	}
	return ""
}

// OpenSQL opens a database that postbox reaches through database/sql (a
// mysql:// or sqlite: URL), with its driver; the caller closes the
// *sql.DB. PostgreSQL URLs are pgx's, and refused here.
func OpenSQL(u string) (postboxdriver.Driver[*sql.Tx], *sql.DB, error) {
	var db *sql.DB
	var err error
	switch URLKind(u) {
	case KindMySQL:
		db, err = postboxmysql.Open(u)
	case KindSQLite:
		db, err = postboxsqlite.Open(strings.TrimPrefix(strings.TrimPrefix(u, "sqlite:"), "//"))
	default:
		return nil, nil, fmt.Errorf("%q is not a database/sql database: want mysql://... or sqlite:PATH", Redact(u))
	}
	if err != nil {
		return nil, nil, err
	}
	var drv postboxdriver.Driver[*sql.Tx]
	if URLKind(u) == KindMySQL {
		drv, err = postboxmysql.New(db)
	} else {
		drv, err = postboxsqlite.New(db)
	}
	if err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	return drv, db, nil
}
