package postboxdriver

import (
	"regexp"
	"time"
)

// Attempts is the failure count of one message at one consumer.
type Attempts struct {
	Attempts       int
	FirstFailureAt time.Time
	LastFailureAt  time.Time
}

var savepointRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidSavepointName reports whether name can name a savepoint: lower-case
// letters, digits and underscores, not starting with a digit, at most 63
// bytes. Drivers splice it into SQL, so they check it.
func ValidSavepointName(name string) bool { return savepointRE.MatchString(name) }
