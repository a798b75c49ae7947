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

// CheckPrefix returns an error naming prefix when it cannot name tables
// (ValidPrefix): what a driver's Open returns for it.
func CheckPrefix(prefix string) error {
	if !ValidPrefix(prefix) {
		return fmt.Errorf("postbox: table prefix %q is not a lower-case SQL identifier of at most %d characters", prefix, MaxPrefixLen)
	}
	return nil
}
