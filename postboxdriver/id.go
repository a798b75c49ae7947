package postboxdriver

import (
	"fmt"

	"github.com/google/uuid"
)

// CanonicalID returns id in the form PostgreSQL prints a uuid in, which is
// also what the partition is hashed from, for drivers that store ids as
// text. The common case, an id already in that form, costs no allocation.
func CanonicalID(id string) (string, error) {
	if isCanonicalUUID(id) {
		return id, nil
	}
	u, err := uuid.Parse(id)
	if err != nil {
		return "", fmt.Errorf("id %q is not a UUID: %w", id, err)
	}
	return u.String(), nil
}

func isCanonicalUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < 36; i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return true
}
