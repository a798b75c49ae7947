// Package postboxmigrate applies postbox's embedded, versioned schema
// migrations, and prints them for teams that run their own migration tool
// (goose, atlas, golang-migrate).
//
//	m, err := postboxmigrate.New(postboxpgx.New(pool), nil)
//	res, err := m.Up(ctx)
//
// Migrations are idempotent: each runs in a transaction under a lock, is
// recorded in {prefix}migrations, and is skipped once applied, so replicas
// that start together can all call Up.
package postboxmigrate

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxdriver"
)

// Config configures a Migrator. A nil Config means the defaults.
type Config struct {
	// Prefix names the tables; default postbox.DefaultPrefix.
	Prefix string
}

// Migrator applies migrations to one database and prefix.
type Migrator struct {
	ex postboxdriver.Executor
}

// New returns a Migrator for the tables driver opens with cfg.Prefix.
func New[TTx any](driver postboxdriver.Driver[TTx], cfg *Config) (*Migrator, error) {
	prefix := postbox.DefaultPrefix
	if cfg != nil && cfg.Prefix != "" {
		prefix = cfg.Prefix
	}
	if err := postbox.ValidatePrefix(prefix); err != nil {
		return nil, err
	}
	store, err := driver.Open(prefix)
	if err != nil {
		return nil, err
	}
	return &Migrator{ex: store}, nil
}

// Status is one migration and whether it is applied.
type Status struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
	Applied bool   `json:"applied"`
}

// Status lists every migration the library knows, applied or not.
func (m *Migrator) Status(ctx context.Context) ([]Status, error) {
	applied, err := m.ex.AppliedMigrations(ctx)
	if err != nil {
		return nil, fmt.Errorf("postboxmigrate: read applied versions: %w", err)
	}
	var out []Status
	for _, mig := range m.ex.Migrations() {
		out = append(out, Status{Version: mig.Version, Name: mig.Name, Applied: slices.Contains(applied, mig.Version)})
	}
	return out, nil
}

// Up applies every pending migration in order and returns the versions it
// applied (none when the schema is current).
func (m *Migrator) Up(ctx context.Context) ([]int, error) {
	status, err := m.Status(ctx)
	if err != nil {
		return nil, err
	}
	var done []int
	migs := m.ex.Migrations()
	for i, s := range status {
		if s.Applied {
			continue
		}
		if err := m.ex.ApplyMigration(ctx, migs[i]); err != nil {
			return done, fmt.Errorf("postboxmigrate: apply %03d_%s: %w", s.Version, s.Name, err)
		}
		done = append(done, s.Version)
	}
	return done, nil
}

// SQL returns the SQL of every migration, in order, as one script with a
// header comment per version, for use with an external migration tool.
func (m *Migrator) SQL() string {
	var b strings.Builder
	for _, mig := range m.ex.Migrations() {
		fmt.Fprintf(&b, "-- postbox migration %03d_%s (%s)\n%s\n", mig.Version, mig.Name, m.ex.Dialect(), strings.TrimSpace(mig.SQL))
		b.WriteString("\n")
	}
	return b.String()
}

// Migrations returns the migrations themselves.
func (m *Migrator) Migrations() []postboxdriver.Migration { return m.ex.Migrations() }
