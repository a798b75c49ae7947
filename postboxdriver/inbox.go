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
	// Crashes counts the handler runs of redeliveries that began
	// (InboxStart) since the message's last recorded outcome and ended
	// with none: the process running them exited.
	Crashes int
}

var savepointRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidSavepointName reports whether name can name a savepoint: lower-case
// letters, digits and underscores, not starting with a digit, at most 63
// bytes. Drivers splice it into SQL, so they check it.
func ValidSavepointName(name string) bool { return savepointRE.MatchString(name) }

// Fresh is what InboxInsertMany reports, for drivers: for each of ids, in
// order, whether it is among inserted, the ids the insert reported as new
// (an INSERT ... ON CONFLICT DO NOTHING RETURNING, in any order).
func Fresh(ids, inserted []string) []bool {
	out := make([]bool, len(ids))
	at := make(map[string]int, len(ids))
	for i, id := range ids {
		at[id] = i
	}
	for _, id := range inserted {
		if i, ok := at[id]; ok {
			out[i] = true
		}
	}
	return out
}
