// Package postboxdrivertest is the storage conformance suite: every
// postbox driver runs it against its real database, so that the semantics
// the relay depends on are the same everywhere.
//
//	func TestConformance(t *testing.T) {
//		postboxdrivertest.Run(t, postboxdrivertest.Harness[pgx.Tx]{...})
//	}
package postboxdrivertest

import (
	"context"
	"testing"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

// Harness tells the suite how to reach one driver's database.
type Harness[TTx any] struct {
	// New returns a driver and a table prefix no other test uses. The suite
	// migrates the tables itself. Cleanup (dropping the tables, closing
	// pools) is registered on t.
	New func(t *testing.T) (postboxdriver.Driver[TTx], string)
	// Migrated, when set, runs after the suite has migrated a prefix's
	// tables and before it opens them: what the database needs beyond its
	// migrations for the driver under test (the storage switch of a
	// driver over the log, as `postbox storage log` makes it).
	Migrated func(t *testing.T, d postboxdriver.Driver[TTx], prefix string)
	// Begin opens a transaction of the user's kind on the database behind
	// the driver, returning it with its commit and rollback.
	Begin func(t *testing.T, ctx context.Context, d postboxdriver.Driver[TTx]) (tx TTx, commit, rollback func() error)
	// Backdate moves the time column of every row of the table named
	// prefix+table back by age, to test retention without waiting.
	Backdate func(t *testing.T, d postboxdriver.Driver[TTx], prefix, table, column string, age time.Duration)
	// Exec runs one statement of the driver's dialect on the database
	// behind the driver, outside any transaction of the suite's, and
	// returns its error: the suite writes rows with SQL, as a service in
	// another language would (the table contract).
	Exec func(t *testing.T, d postboxdriver.Driver[TTx], query string, args ...any) error
	// Locate names the database behind d for a relay in another process:
	// the crash tests start the test binary again, and the driver's
	// TestMain hands such a process to Child, which opens the database
	// from this name.
	Locate func(t *testing.T, d postboxdriver.Driver[TTx]) string
	// Sever ends the database connection under tx from another
	// connection, as an administrator's kill or a restart of the server
	// does, and returns once the server has ended it. Nil where the
	// database has no connections to end (SQLite): the tests that need it
	// are skipped.
	Sever func(t *testing.T, d postboxdriver.Driver[TTx], tx TTx)
	// Features declares what differs between databases.
	Features Features
}

// Features declares how a database differs from the others; tests that
// depend on a difference run only where it is declared, and say so when
// skipped. Every operation of postboxdriver.Executor is required, so none
// of them is a feature.
type Features struct {
	// ConcurrentWriters is true where two write transactions can be open at
	// once (PostgreSQL). SQLite serializes writers, so a late commit can
	// never carry a lower seq than an earlier one there.
	ConcurrentWriters bool
}
