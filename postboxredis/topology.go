package postboxredis

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/redis/go-redis/v9"

	"github.com/postbox-go/postbox/internal/configcheck"
)

// Start ids for EnsureGroup.
const (
	// StartAtBeginning makes a new group deliver every entry the stream
	// holds, then the new ones.
	StartAtBeginning = "0"
	// StartAtEnd makes a new group deliver only entries added after it
	// was created.
	StartAtEnd = "$"
)

var entryIDPattern = regexp.MustCompile(`^[0-9]{1,20}(-[0-9]{1,20})?$`)

// EnsureGroup creates the consumer group group on stream, starting at
// startID (StartAtBeginning, StartAtEnd, or an entry id), and the stream
// too when it does not exist (XGROUP CREATE ... MKSTREAM). A group that
// exists already is left as it is, whatever its position: EnsureGroup is
// idempotent, and every replica may run it at start-up or deploy.
//
// It is the explicit topology step: publishing never creates a stream
// (a message to a missing stream fails with ErrNoStream), and
// subscribing never creates a group (Run fails with ErrNoGroup). So a
// stream must exist before the first publish to it: made by EnsureGroup
// for its first consumer group, or by the operator.
func EnsureGroup(ctx context.Context, client redis.UniversalClient, stream, group, startID string) error {
	if client == nil {
		return errors.New("postboxredis: EnsureGroup needs a Redis client")
	}
	if err := ValidateStreamName(stream); err != nil {
		return fmt.Errorf("postboxredis: ensure group: %w", err)
	}
	if err := validateName(group); err != nil {
		return fmt.Errorf("postboxredis: ensure group %q: invalid group name: %w", configcheck.Shorten(group), err)
	}
	if startID != StartAtEnd && !entryIDPattern.MatchString(startID) {
		return fmt.Errorf("postboxredis: ensure group %q: invalid start id %q: want %q, %q or an entry id", group, configcheck.Shorten(startID), StartAtBeginning, StartAtEnd)
	}
	err := client.XGroupCreateMkStream(ctx, stream, group, startID).Err()
	if err != nil && !redis.HasErrorPrefix(err, "BUSYGROUP") {
		if redis.HasErrorPrefix(err, "WRONGTYPE") {
			err = fmt.Errorf("%w: %w", ErrWrongType, err)
		}
		return fmt.Errorf("postboxredis: ensure group %q on stream %q: %w", group, stream, err)
	}
	return nil
}
