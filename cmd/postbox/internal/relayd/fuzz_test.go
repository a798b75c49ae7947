package relayd_test

import (
	"errors"
	"testing"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/cmd/postbox/internal/relayd"
)

// Any bytes as a configuration file: no panic, and either a parse error,
// a *ConfigError naming fields, or a configuration with a database.
func FuzzRelayConfig(f *testing.F) {
	f.Add([]byte("databases: [{url: \"postgres://h/db\"}]\nrelay: {lease: 30s, retention: 7d}\n"))
	f.Add([]byte("databases: [{url: \"sqlite:/tmp/a.db\", prefix: x_}]\nroutes: [{topics: \"a.*\", publisher: amqp}]\namqp: {url: \"amqp://h\"}\n"))
	f.Add([]byte("admin: {tokens: [{name: a, value: short, scope: root}]}\n"))
	f.Add([]byte("relay: {lease: -5s, batch_size: 99999999999}\n"))
	f.Add([]byte("{{{{"))
	f.Add([]byte("databases: !!binary AAAA\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		cfg, err := relayd.Parse(b, func(string) string { return "" })
		if err != nil {
			return
		}
		err = cfg.Validate()
		var ce *postbox.ConfigError
		switch {
		case err == nil:
			if len(cfg.Databases) == 0 {
				t.Fatal("a configuration without databases validated")
			}
		case errors.As(err, &ce):
			for _, p := range ce.Problems {
				if p.Field == "" || p.Reason == "" {
					t.Fatalf("problem without field or reason: %+v", p)
				}
			}
		default:
			t.Fatalf("Validate returned %T, not *ConfigError: %v", err, err)
		}
	})
}
