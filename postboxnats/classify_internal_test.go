package postboxnats

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubkit"
)

func TestClassify(t *testing.T) {
	api := func(code jetstream.ErrorCode, desc string) error {
		return &jetstream.APIError{Code: 400, ErrorCode: code, Description: desc}
	}
	wrap := func(err error) error { return fmt.Errorf("postboxnats: publish: %w", err) }
	for _, tc := range []struct {
		name string
		err  error
		want pubkit.Fault
	}{
		{"already a message error", postbox.NewMessageError(io.EOF), pubkit.Message},
		{"already permanent", postbox.Permanent(io.EOF), pubkit.Permanent},
		{"context canceled", context.Canceled, pubkit.Infra},
		{"context deadline, wrapped", wrap(context.DeadlineExceeded), pubkit.Infra},
		{"over max_payload", nats.ErrMaxPayload, pubkit.Permanent},
		{"over max_payload, wrapped", wrap(nats.ErrMaxPayload), pubkit.Permanent},
		{"client: bad subject", nats.ErrBadSubject, pubkit.Permanent},
		{"client: bad header", nats.ErrBadHeaderMsg, pubkit.Permanent},
		{"jetstream: invalid subject", jetstream.ErrInvalidSubject, pubkit.Permanent},
		{"invalid subject", ErrInvalidSubject, pubkit.Permanent},
		{"invalid header", ErrInvalidHeader, pubkit.Permanent},
		{"no id", ErrNoID, pubkit.Permanent},
		{"no stream, confirmed", wrap(ErrNoStream), pubkit.Message},
		{"no stream response", jetstream.ErrNoStreamResponse, pubkit.Unconfirmed},
		{"no responders", nats.ErrNoResponders, pubkit.Unconfirmed},
		{"no responders, wrapped", wrap(nats.ErrNoResponders), pubkit.Unconfirmed},
		{"stream max_msg_size", api(10054, "message size exceeds maximum allowed"), pubkit.Permanent},
		{"stream max_msg_size, sentinel", jetstream.ErrStreamMessageExceedsMaximum, pubkit.Permanent},
		{"header over 64k", api(10097, "header size exceeds maximum allowed of 64k"), pubkit.Permanent},
		{"expected stream mismatch", wrap(api(10060, "expected stream does not match")), pubkit.Message},
		{"sealed stream", api(10109, "invalid operation on sealed stream"), pubkit.Message},
		{"file store record too large", api(10077, "message too large"), pubkit.Permanent},
		{"stream full, discard new", api(10077, "maximum messages exceeded"), pubkit.Infra},
		{"stream bytes full", api(10077, "maximum bytes exceeded"), pubkit.Infra},
		{"insufficient resources", api(10023, "insufficient resources"), pubkit.Infra},
		{"duplicate in process", api(10158, "duplicate message id is in process"), pubkit.Infra},
		{"too many requests", api(10167, "too many requests"), pubkit.Infra},
		{"stream offline", api(10118, "stream is offline"), pubkit.Infra},
		{"jetstream not enabled", jetstream.ErrJetStreamNotEnabled, pubkit.Infra},
		{"ack timeout", jetstream.ErrAsyncPublishTimeout, pubkit.Infra},
		{"request timeout", nats.ErrTimeout, pubkit.Infra},
		{"disconnected", nats.ErrDisconnected, pubkit.Infra},
		{"connection closed", nats.ErrConnectionClosed, pubkit.Infra},
		{"jetstream: connection closed", jetstream.ErrConnectionClosed, pubkit.Infra},
		{"reconnect buffer full", nats.ErrReconnectBufExceeded, pubkit.Infra},
		{"invalid ack", jetstream.ErrInvalidJSAck, pubkit.Infra},
		{"publisher closed", ErrClosed, pubkit.Infra},
		{"client context closed", jetstream.ErrJetStreamPublisherClosed, pubkit.Infra},
		{"unknown", errors.New("something odd"), pubkit.Infra},
	} {
		if got := classify(tc.err); got != tc.want {
			t.Errorf("%s: classify(%v) = %d, want %d", tc.name, tc.err, got, tc.want)
		}
	}
}

// TestSubjectMatches: the consumer's filters, as the server matches them.
func TestSubjectMatches(t *testing.T) {
	for _, c := range []struct {
		filter, subject string
		want            bool
	}{
		{"a.b", "a.b", true}, {"a.b", "a.c", false}, {"a.*", "a.b", true}, {"a.*", "a.b.c", false},
		{"a.>", "a.b.c", true}, {"a.>", "a", false}, {"*.b", "a.b", true}, {">", "a", true}, {"a", "a.b", false},
	} {
		if got := subjectMatches(c.filter, c.subject); got != c.want {
			t.Errorf("subjectMatches(%q, %q) = %v, want %v", c.filter, c.subject, got, c.want)
		}
	}
}
