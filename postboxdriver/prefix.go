package postboxdriver

import (
	"fmt"
	"regexp"
)

// MaxPrefixLen bounds a table prefix. PostgreSQL cuts identifiers at 63
// bytes without a word, and the longest name postbox derives from a prefix
// (a table, index or constraint) adds up to 31 bytes to it.
const MaxPrefixLen = 32

var prefixRE = regexp.MustCompile(fmt.Sprintf(`^[a-z_][a-z0-9_]{0,%d}$`, MaxPrefixLen-1))

// ValidPrefix reports whether prefix can name tables: lower-case letters,
// digits and underscores, not starting with a digit, at most MaxPrefixLen
// bytes. Drivers splice it into SQL, so they check it again.
func ValidPrefix(prefix string) bool { return prefixRE.MatchString(prefix) }
