package postboxmysql_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/mysqltest"
	"github.com/postbox-go/postbox/postboxmysql"
)

// Migration 6 refuses a key holding a NUL byte in a row inserted with SQL,
// and in an update that changes the key, naming the key rule; rows of
// postbox's own writer (checked set) skip it as they skip the other rules,
// and an update that leaves the key alone, as the relay's do, passes over
// a key written before. It replaces the rules triggers through second
// ones: cut short after any of its statements, the rules of migration 5
// still hold every insert and update, and run again whole it ends with
// migration 5's two triggers, refusing the key.
func TestKeyRuleRefusesNUL(t *testing.T) {
	ctx := context.Background()
	d, prefix := mysqltest.Migrated(t)
	db := d.DB()
	st, err := d.Open(prefix)
	if err != nil {
		t.Fatal(err)
	}
	var five, six []string
	for _, m := range st.Migrations() {
		switch m.Version {
		case 5:
			five = postboxmysql.Statements(m.SQL)
		case 6:
			six = postboxmysql.Statements(m.SQL)
		}
	}
	if len(six) == 0 {
		t.Fatal("no migration 6")
	}
	exec := func(q string, args ...any) error {
		_, err := db.ExecContext(ctx, q, args...)
		return err
	}
	must := func(q string, args ...any) {
		t.Helper()
		if err := exec(q, args...); err != nil {
			t.Fatalf("%.80s: %v", q, err)
		}
	}
	insert := func(key any, headers string, checked bool) (string, error) {
		id := postbox.NewID()
		return id, exec("INSERT INTO "+prefix+"outbox (id, topic, `key`, payload, headers, checked) VALUES (?, 'contract.t', ?, 'p', ?, ?)",
			id, key, headers, checked)
	}
	// refused reports whether err is the trigger's SIGNAL naming rule.
	refused := func(err error, rule string) bool {
		var me *mysql.MySQLError
		return errors.As(err, &me) && me.Number == 1644 && strings.Contains(me.Message, prefix+"outbox_"+rule+"_check")
	}
	triggers := func() []string {
		rows, err := db.QueryContext(ctx, `SELECT trigger_name FROM information_schema.triggers
WHERE trigger_schema = DATABASE() AND event_object_table = ? ORDER BY trigger_name`, prefix+"outbox")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
			out = append(out, n)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	keyRuleHolds := func(stage string) {
		t.Helper()
		for _, key := range []string{"a\x00b", "\x00", "k\x00"} {
			if _, err := insert(key, `{}`, false); !refused(err, "key") {
				t.Errorf("%s: insert of key %q: err = %v, want the key rule", stage, key, err)
			}
		}
		id, err := insert("k", `{}`, false)
		if err != nil {
			t.Fatalf("%s: a good key: %v", stage, err)
		}
		if err := exec("UPDATE "+prefix+"outbox SET `key` = ? WHERE id = ?", "k\x00", id); !refused(err, "key") {
			t.Errorf("%s: update of the key to one holding NUL: err = %v, want the key rule", stage, err)
		}
		must("UPDATE "+prefix+"outbox SET `key` = 'k2' WHERE id = ?", id)
	}
	want := []string{prefix + "outbox_rules_insert", prefix + "outbox_rules_update"}
	if got := triggers(); !slices.Equal(got, want) {
		t.Fatalf("triggers %v, want %v", got, want)
	}
	keyRuleHolds("migrated")

	// Postbox's writer checked its rows in Go: they skip the rules. A row
	// with such a key (one written before migration 6, say) is not held
	// up by the relay's updates, which leave the key alone.
	id, err := insert("a\x00b", `{}`, true)
	if err != nil {
		t.Fatalf("a checked row: %v", err)
	}
	must("UPDATE "+prefix+"outbox SET attempts = attempts + 1, last_error = 'x', available_at = available_at + 1000 WHERE id = ?", id)
	var key sql.NullString
	if err := db.QueryRowContext(ctx, "SELECT `key` FROM "+prefix+"outbox WHERE id = ?", id).Scan(&key); err != nil || key.String != "a\x00b" {
		t.Fatalf("the checked row's key %q, %v", key.String, err)
	}

	for k := 0; k <= len(six); k++ {
		// Migration 5's triggers, then migration 6 cut short after k
		// statements.
		for _, name := range []string{"outbox_rules_insert", "outbox_rules_update", "outbox_rules_insert_6", "outbox_rules_update_6"} {
			must("DROP TRIGGER IF EXISTS " + prefix + name)
		}
		for _, s := range five {
			must(s)
		}
		for _, s := range six[:k] {
			must(s)
		}
		// Migration 5's rules hold whatever was cut.
		if _, err := insert(nil, `{"nats-msg-id": "x"}`, false); !refused(err, "header_reserved") {
			t.Errorf("cut after %d statements: insert with a reserved header: err = %v", k, err)
		}
		id, err := insert(nil, `{}`, false)
		if err != nil {
			t.Fatalf("cut after %d statements: %v", k, err)
		}
		if err := exec("UPDATE "+prefix+`outbox SET headers = '{"nats-rollup": "all"}' WHERE id = ?`, id); !refused(err, "header_reserved") {
			t.Errorf("cut after %d statements: update to a reserved header: err = %v", k, err)
		}
		// Run again whole.
		for _, s := range six {
			must(s)
		}
		if got := triggers(); !slices.Equal(got, want) {
			t.Fatalf("cut after %d statements and run again: triggers %v, want %v", k, got, want)
		}
		keyRuleHolds("cut and run again")
	}
}
