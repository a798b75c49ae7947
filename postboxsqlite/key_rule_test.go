package postboxsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxdriver"
)

// keyRule is the error the table gives a key Go refuses.
const keyRule = prefix + "outbox_key_check"

// keyInsert inserts a row carrying a key with SQL, as a writer in another
// language would.
const keyInsert = `INSERT INTO ` + prefix + `outbox (id, topic, key, payload, partition) VALUES (?, 'contract.t', ?, x'', ?)`

// keyArgs are keyInsert's arguments for a row carrying key: a new id, the
// key, and the partition postbox's writer would give the row.
func keyArgs(key string) []any {
	id := postbox.NewID()
	return []any{id, key, postboxdriver.PartitionOf(key, id, 64)}
}

// insertKey inserts a row carrying key through db.
func insertKey(db *sql.DB, key string) error {
	_, err := db.Exec(keyInsert, keyArgs(key)...)
	return err
}

// The table refuses a key that is not valid UTF-8 text or holds a NUL
// byte, as Go's WriteTx does, naming the key rule; every key Go accepts
// passes, through SQL and through WriteTx.
func TestKeyRuleMatchesGo(t *testing.T) {
	f := migrated(t)
	ctx := context.Background()
	c, err := postbox.NewClient(f.d, &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{
		"\x00", "a\x00", "\x00b", "a\x00b", // NUL anywhere
		"\x80", "a\xbf", // a stray continuation byte
		"\xc3", "a\xc3", "\xc3(", "\xe2\x82", "\xf0\x9f\x98", // truncated
		"\xc3\xa9\xa9", "\xe2\x82\xac\x82", // a continuation too many
		"\xc0\x80", "\xc1\xbf", "\xe0\x82\x80", "\xf0\x82\x82\xac", // overlong
		"\xed\xa0\x80", "\xed\xbf\xbf", // surrogates
		"\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\xf8\x88\x80\x80\x80", "\xff", "\xfe", // beyond U+10FFFF
		"ok\xffok", strings.Repeat("é", 100) + "\xff",
	} {
		werr := c.Write(ctx, postbox.Message{Topic: "contract.go", Key: key})
		var ve *postbox.ValidationError
		if !errors.As(werr, &ve) || !strings.HasSuffix(ve.Field, ".key") {
			t.Fatalf("key %q: Go's WriteTx: %v, want the key refused", key, werr)
		}
		if err := insertKey(f.db, key); err == nil || !strings.Contains(err.Error(), keyRule) {
			t.Errorf("key %q: err = %v, want one naming %s", key, err, keyRule)
		}
	}
	for _, key := range []string{
		"k", "\x7f", "\t", "é", "€", "😀", "\u07ff", "\u0800", "\ud7ff", "\ue000",
		"\ufffd", "\ufffe", "\uffff", "\U00010000", "\U0010ffff",
		strings.Repeat("é", 127) + "x", strings.Repeat("😀", 63) + "abc",
	} {
		if err := c.Write(ctx, postbox.Message{Topic: "contract.go", Key: key}); err != nil {
			t.Fatalf("key %q: Go's WriteTx: %v", key, err)
		}
		if err := insertKey(f.db, key); err != nil {
			t.Errorf("key %q, valid: %v", key, err)
		}
	}
	if st := f.stats(t); st.Pending != 2*17 {
		t.Fatalf("pending = %d, want the 34 rows of valid keys alone", st.Pending)
	}

	// An update of the key is held to the rule too.
	upd := `UPDATE ` + prefix + `outbox SET key = ? WHERE key = 'k'`
	for _, key := range []string{"k\x00", "k\xff"} {
		if _, err := f.db.Exec(upd, key); err == nil || !strings.Contains(err.Error(), keyRule) {
			t.Errorf("update to key %q: err = %v, want one naming %s", key, err, keyRule)
		}
	}
	if _, err := f.db.Exec(upd, "kä"); err != nil {
		t.Errorf("update to a valid key: %v", err)
	}
}

// The table's judgement of a key is Go's (utf8.ValidString, no NUL) for
// every key of one byte, every second byte after the lead bytes at the
// edges of UTF-8's ranges, and keys of two to six bytes drawn from the
// values at those edges.
func TestKeyRuleAgreesWithUTF8(t *testing.T) {
	f := migrated(t)
	tx, err := f.db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	// Prepared once: SQLite compiles the triggers into every statement.
	insert, err := tx.Prepare(keyInsert)
	if err != nil {
		t.Fatal(err)
	}
	defer insert.Close()
	check := func(key string) {
		t.Helper()
		want := utf8.ValidString(key) && !strings.Contains(key, "\x00")
		_, err := insert.Exec(keyArgs(key)...)
		switch {
		case want && err != nil:
			t.Fatalf("key %q (% x), valid UTF-8: %v", key, key, err)
		case !want && (err == nil || !strings.Contains(err.Error(), keyRule)):
			t.Fatalf("key %q (% x), invalid: err = %v, want one naming %s", key, key, err, keyRule)
		}
	}
	edges := []byte{0x00, 0x01, 'a', 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2, 0xdf,
		0xe0, 0xe1, 0xec, 0xed, 0xee, 0xef, 0xf0, 0xf1, 0xf3, 0xf4, 0xf5, 0xf7, 0xf8, 0xfe, 0xff}
	for a := range 256 {
		check(string([]byte{byte(a)}))
	}
	for _, a := range []byte{0xc1, 0xc2, 0xdf, 0xe0, 0xed, 0xf0, 0xf4} {
		for b := range 256 {
			check(string([]byte{a, byte(b)}))
		}
	}
	rng := rand.New(rand.NewPCG(11, 15))
	for range 3000 {
		key := make([]byte, 2+rng.IntN(5))
		for i := range key {
			key[i] = edges[rng.IntN(len(edges))]
		}
		check(string(key))
	}
}
