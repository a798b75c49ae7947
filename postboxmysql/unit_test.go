package postboxmysql_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/postbox-go/postbox/internal/mysqltest"
	"github.com/postbox-go/postbox/postboxmysql"
)

func TestParseDSN(t *testing.T) {
	for _, c := range []struct{ in, addr, user, pass, db string }{
		{"mysql://root@127.0.0.1:3306/test", "127.0.0.1:3306", "root", "", "test"},
		{"mysql://app:s3cret@db.internal/orders?maxAllowedPacket=0", "db.internal:3306", "app", "s3cret", "orders"},
		{"app:pw@tcp(10.0.0.1:3307)/shop", "10.0.0.1:3307", "app", "pw", "shop"},
		{"mysql://app:p%40ss%3Aw%2Fd@[::1]:3308/shop", "[::1]:3308", "app", "p@ss:w/d", "shop"},
	} {
		cfg, err := postboxmysql.ParseDSN(c.in)
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if cfg.Addr != c.addr || cfg.User != c.user || cfg.Passwd != c.pass || cfg.DBName != c.db {
			t.Errorf("%s: addr %s user %s pass %s db %s", c.in, cfg.Addr, cfg.User, cfg.Passwd, cfg.DBName)
		}
	}
	if _, err := postboxmysql.ParseDSN("mysql://root@127.0.0.1:3306/test?tls=nonsense-profile"); err == nil {
		t.Error("an unknown TLS profile was accepted")
	}
	// Arguments go with their statement unless the DSN says otherwise.
	for dsn, want := range map[string]bool{
		"mysql://root@127.0.0.1/test":                         true,
		"mysql://root@127.0.0.1/test?interpolateParams=false": false,
		"root@tcp(127.0.0.1:3306)/test?collation=utf8mb4_bin": false,
	} {
		if cfg, err := postboxmysql.ParseDSN(dsn); err != nil || cfg.InterpolateParams != want {
			t.Errorf("%s: interpolateParams %v (%v), want %v", dsn, cfg.InterpolateParams, err, want)
		}
	}
}

// The migrations split as the mysql client reads a script: by ";" at the
// end of a line, and by the delimiter a DELIMITER line sets.
func TestStatements(t *testing.T) {
	got := postboxmysql.Statements(`-- a comment; not a statement
CREATE TABLE a (x INT);
INSERT INTO a VALUES (1),
  (2);
DELIMITER //
CREATE PROCEDURE p() BEGIN
  SELECT 1;
  SELECT 2;
END
//
DELIMITER ;
DROP TABLE a;`)
	want := []string{
		"CREATE TABLE a (x INT)",
		"INSERT INTO a VALUES (1),\n  (2)",
		"CREATE PROCEDURE p() BEGIN\n  SELECT 1;\n  SELECT 2;\nEND",
		"DROP TABLE a",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}

// The relay warns when InnoDB does not flush its log at each commit: a
// crash could then undo a transaction whose message was published.
func TestDurabilityWarnings(t *testing.T) {
	ctx := context.Background()
	d, prefix := mysqltest.Driver(t)
	st, err := d.Open(prefix)
	if err != nil {
		t.Fatal(err)
	}
	var was int
	db := d.DB()
	if err := db.QueryRowContext(ctx, `SELECT @@GLOBAL.innodb_flush_log_at_trx_commit`).Scan(&was); err != nil {
		t.Fatal(err)
	}
	if was != 1 {
		t.Skipf("the server runs with innodb_flush_log_at_trx_commit = %d", was)
	}
	if w, err := st.DurabilityWarnings(ctx); err != nil || len(w) != 0 {
		t.Fatalf("durable server: %q, %v", w, err)
	}
	if _, err := db.ExecContext(ctx, `SET GLOBAL innodb_flush_log_at_trx_commit = 2`); err != nil {
		t.Skipf("cannot change the setting: %v", err)
	}
	defer func() {
		if _, err := db.ExecContext(ctx, `SET GLOBAL innodb_flush_log_at_trx_commit = 1`); err != nil {
			t.Errorf("restore innodb_flush_log_at_trx_commit: %v", err)
		}
	}()
	w, err := st.DurabilityWarnings(ctx)
	if err != nil || len(w) != 1 || !strings.Contains(w[0], "innodb_flush_log_at_trx_commit = 2") {
		t.Fatalf("warnings %q, %v", w, err)
	}
}
