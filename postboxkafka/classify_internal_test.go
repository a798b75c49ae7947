package postboxkafka

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubkit"
)

func TestClassify(t *testing.T) {
	cases := []struct {
		err  error
		want pubkit.Fault
	}{
		{postbox.NewMessageError(errors.New("x")), pubkit.Message},
		{fmt.Errorf("wrapped: %w", postbox.NewMessageError(errors.New("x"))), pubkit.Message},
		{ErrNoTopic, pubkit.Message},
		{postbox.Permanent(errors.New("x")), pubkit.Permanent},
		{ErrInvalidTopic, pubkit.Permanent},
		{ErrInvalidHeader, pubkit.Permanent},
		{ErrNoID, pubkit.Permanent},
		{kerr.MessageTooLarge, pubkit.Permanent},
		{fmt.Errorf("%w (uncompressed_bytes=9)", kerr.MessageTooLarge), pubkit.Permanent},
		{kerr.RecordListTooLarge, pubkit.Permanent},
		{kerr.InvalidRecord, pubkit.Message},
		{kerr.InvalidTopicException, pubkit.Message},
		{kerr.TopicAuthorizationFailed, pubkit.Message},
		{kerr.PolicyViolation, pubkit.Message},
		{kerr.UnknownTopicOrPartition, pubkit.Unconfirmed},
		{kerr.UnknownTopicID, pubkit.Unconfirmed},
		{context.Canceled, pubkit.Infra},
		{context.DeadlineExceeded, pubkit.Infra},
		{ErrClosed, pubkit.Infra},
		{ErrPublishTimeout, pubkit.Infra},
		{kerr.NotEnoughReplicas, pubkit.Infra},
		{kerr.NotEnoughReplicasAfterAppend, pubkit.Infra},
		{kerr.NotLeaderForPartition, pubkit.Infra},
		{kerr.LeaderNotAvailable, pubkit.Infra},
		{kerr.RequestTimedOut, pubkit.Infra},
		{kerr.ClusterAuthorizationFailed, pubkit.Infra},
		{kerr.InvalidTimestamp, pubkit.Infra},
		{kerr.CorruptMessage, pubkit.Infra},
		{kgo.ErrRecordTimeout, pubkit.Infra},
		{kgo.ErrRecordRetries, pubkit.Infra},
		{kgo.ErrClientClosed, pubkit.Infra},
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, pubkit.Infra},
		{errors.New("something new"), pubkit.Infra},
	}
	for _, tc := range cases {
		if got := classify(tc.err); got != tc.want {
			t.Errorf("classify(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}
