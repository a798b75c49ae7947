package postboxredis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/postbox-go/postbox"
)

// replyError is an error reply as the client reports it: any error with a
// RedisError method.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

func TestClassify(t *testing.T) {
	message := []error{
		postbox.NewMessageError(errors.New("anything")),
		ErrNoStream, ErrWrongType, ErrInvalidStream,
		ErrTooLarge, ErrInvalidHeader, ErrNoID,
		fmt.Errorf("publish x: %w", ErrNoStream),
		replyError("WRONGTYPE Operation against a key holding the wrong kind of value"),
		redis.ErrCrossSlot,
		replyError("ERR Protocol error: invalid bulk length"),
		replyError("ERR string exceeds maximum allowed size (proto-max-bulk-len)"),
		fmt.Errorf("wrapped: %w", replyError("WRONGTYPE x")),
	}
	infra := []error{
		context.Canceled, context.DeadlineExceeded,
		fmt.Errorf("deadline: %w", context.DeadlineExceeded),
		ErrClosed, ErrPublishTimeout, ErrNotReplicated,
		&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED},
		&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET},
		io.EOF, io.ErrUnexpectedEOF,
		redis.ErrClosed, redis.ErrPoolTimeout, redis.ErrNoScript,
		replyError("LOADING Redis is loading the dataset in memory"),
		replyError("READONLY You can't write against a read only replica."),
		replyError("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
		replyError("CLUSTERDOWN The cluster is down"),
		replyError("TRYAGAIN Multiple keys request during rehashing of slot"),
		replyError("NOREPLICAS Not enough good replicas to write."),
		replyError("BUSY Redis is busy running a script."),
		replyError("OOM command not allowed when used memory > 'maxmemory'."),
		replyError("NOAUTH Authentication required."),
		replyError("WRONGPASS invalid username-password pair or user is disabled."),
		replyError("NOPERM this user has no permissions to run the 'evalsha' command"),
		replyError("ERR max number of clients reached"),
		replyError("ERR unknown command 'evalsha'"),
		errors.New("something nobody foresaw"),
	}
	for _, err := range message {
		if !isMessageFault(err) {
			t.Errorf("isMessageFault(%v) = false, want true", err)
		}
		if got := classified(err); !postbox.IsMessageError(got) || !errors.Is(got, err) {
			t.Errorf("classified(%v) = %v, want a message failure wrapping it", err, got)
		}
	}
	// Of those, what no retry can cure is permanent.
	permanent := map[error]bool{ErrInvalidStream: true, ErrTooLarge: true, ErrInvalidHeader: true, ErrNoID: true,
		message[10]: true, message[11]: true}
	for _, err := range message {
		if got := classified(err); postbox.IsPermanent(got) != permanent[err] {
			t.Errorf("classified(%v) = %v: permanent %v, want %v", err, got, postbox.IsPermanent(got), permanent[err])
		}
	}
	for _, err := range infra {
		if isMessageFault(err) {
			t.Errorf("isMessageFault(%v) = true, want false", err)
		}
		if got := classified(err); !errors.Is(got, err) || postbox.IsMessageError(got) != postbox.IsMessageError(err) {
			t.Errorf("classified(%v) = %v, want it unchanged", err, got)
		}
	}
}
