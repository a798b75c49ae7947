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
)

func TestClassify(t *testing.T) {
	api := func(code jetstream.ErrorCode, desc string) error {
		return &jetstream.APIError{Code: 400, ErrorCode: code, Description: desc}
	}
	wrap := func(err error) error { return fmt.Errorf("postboxnats: publish: %w", err) }
	for _, tc := range []struct {
		name string
		err  error
		want fault
	}{
		{"already a message error", postbox.NewMessageError(io.EOF), messageFault},
		{"context canceled", context.Canceled, infraFault},
		{"context deadline, wrapped", wrap(context.DeadlineExceeded), infraFault},
		{"over max_payload", nats.ErrMaxPayload, messageFault},
		{"over max_payload, wrapped", wrap(nats.ErrMaxPayload), messageFault},
		{"client: bad subject", nats.ErrBadSubject, messageFault},
		{"client: bad header", nats.ErrBadHeaderMsg, messageFault},
		{"jetstream: invalid subject", jetstream.ErrInvalidSubject, messageFault},
		{"invalid subject", ErrInvalidSubject, messageFault},
		{"invalid header", ErrInvalidHeader, messageFault},
		{"no id", ErrNoID, messageFault},
		{"no stream, confirmed", wrap(ErrNoStream), messageFault},
		{"no stream response", jetstream.ErrNoStreamResponse, unconfirmedFault},
		{"no responders", nats.ErrNoResponders, unconfirmedFault},
		{"no responders, wrapped", wrap(nats.ErrNoResponders), unconfirmedFault},
		{"stream max_msg_size", api(10054, "message size exceeds maximum allowed"), messageFault},
		{"stream max_msg_size, sentinel", jetstream.ErrStreamMessageExceedsMaximum, messageFault},
		{"header over 64k", api(10097, "header size exceeds maximum allowed of 64k"), messageFault},
		{"expected stream mismatch", wrap(api(10060, "expected stream does not match")), messageFault},
		{"sealed stream", api(10109, "invalid operation on sealed stream"), messageFault},
		{"file store record too large", api(10077, "message too large"), messageFault},
		{"stream full, discard new", api(10077, "maximum messages exceeded"), infraFault},
		{"stream bytes full", api(10077, "maximum bytes exceeded"), infraFault},
		{"insufficient resources", api(10023, "insufficient resources"), infraFault},
		{"duplicate in process", api(10158, "duplicate message id is in process"), infraFault},
		{"too many requests", api(10167, "too many requests"), infraFault},
		{"stream offline", api(10118, "stream is offline"), infraFault},
		{"jetstream not enabled", jetstream.ErrJetStreamNotEnabled, infraFault},
		{"ack timeout", jetstream.ErrAsyncPublishTimeout, infraFault},
		{"request timeout", nats.ErrTimeout, infraFault},
		{"disconnected", nats.ErrDisconnected, infraFault},
		{"connection closed", nats.ErrConnectionClosed, infraFault},
		{"jetstream: connection closed", jetstream.ErrConnectionClosed, infraFault},
		{"reconnect buffer full", nats.ErrReconnectBufExceeded, infraFault},
		{"invalid ack", jetstream.ErrInvalidJSAck, infraFault},
		{"publisher closed", ErrClosed, infraFault},
		{"client context closed", jetstream.ErrJetStreamPublisherClosed, infraFault},
		{"unknown", errors.New("something odd"), infraFault},
	} {
		if got := classify(tc.err); got != tc.want {
			t.Errorf("%s: classify(%v) = %d, want %d", tc.name, tc.err, got, tc.want)
		}
	}
}
