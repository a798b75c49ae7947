// Package sqlitetest gives tests a fresh SQLite database of their own, in
// the test's temporary directory, through postboxsqlite. It is a module of
// its own so that the core module's tests never need SQLite.
package sqlitetest

import (
	"path/filepath"
	"testing"

	"github.com/postbox-go/postbox/postboxsqlite"
)

// Driver opens a fresh SQLite database in t's temporary directory, closed
// when t ends. Its tables are not migrated.
func Driver(t testing.TB) *postboxsqlite.Driver {
	t.Helper()
	return DriverAt(t, Path(t))
}

// DriverAt opens the SQLite database at path (made if missing), closed
// when t ends.
func DriverAt(t testing.TB, path string) *postboxsqlite.Driver {
	t.Helper()
	db, err := postboxsqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	d, err := postboxsqlite.New(db)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Path returns a path for a fresh SQLite database file in t's temporary
// directory.
func Path(t testing.TB) string {
	return filepath.Join(t.TempDir(), "postbox.db")
}
