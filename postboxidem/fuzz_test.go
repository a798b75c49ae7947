package postboxidem_test

import (
	"strings"
	"testing"

	"github.com/postbox-go/postbox/postboxidem"
)

// FuzzIdempotencyKeyHeader: ParseKey never panics, accepts only keys of 1
// to 255 printable ASCII bytes, and reads a key back from its quoted form
// (and from its bare form, where that form exists) unchanged.
func FuzzIdempotencyKeyHeader(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b\\c"`, `"abc";p=1`, "a,b", `""`, "ключ", strings.Repeat("k", 255)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, header string) {
		key, err := postboxidem.ParseKey(header)
		if err != nil {
			if key != "" {
				t.Fatalf("ParseKey(%q) = %q with error %v", header, key, err)
			}
			return
		}
		if len(key) < 1 || len(key) > postboxidem.MaxKeyBytes {
			t.Fatalf("ParseKey(%q) = %q: %d bytes", header, key, len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("ParseKey(%q) = %q: byte %#x is not printable ASCII", header, key, key[i])
			}
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		if k, err := postboxidem.ParseKey(quoted); err != nil || k != key {
			t.Fatalf("quoted form %q of %q reads as %q, %v", quoted, key, k, err)
		}
		if !strings.ContainsAny(key, `"\,`) && strings.TrimSpace(key) == key {
			if k, err := postboxidem.ParseKey(key); err != nil || k != key {
				t.Fatalf("bare form of %q reads as %q, %v", key, k, err)
			}
		}
	})
}
