package postboxnats_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxnats"
)

func TestClassify(t *testing.T) {
	api := func(code jetstream.ErrorCode, desc string) error {
		return &jetstream.APIError{Code: 400, ErrorCode: code, Description: desc}
	}
	wrap := func(err error) error { return fmt.Errorf("postboxnats: publish: %w", err) }
	for _, tc := range []struct {
		name string
		err  error
		want postboxnats.Class
	}{
		{"already a message error", postbox.NewMessageError(io.EOF), postboxnats.Message},
		{"context canceled", context.Canceled, postboxnats.Infrastructure},
		{"context deadline, wrapped", wrap(context.DeadlineExceeded), postboxnats.Infrastructure},
		{"over max_payload", nats.ErrMaxPayload, postboxnats.Message},
		{"over max_payload, wrapped", wrap(nats.ErrMaxPayload), postboxnats.Message},
		{"client: bad subject", nats.ErrBadSubject, postboxnats.Message},
		{"client: bad header", nats.ErrBadHeaderMsg, postboxnats.Message},
		{"jetstream: invalid subject", jetstream.ErrInvalidSubject, postboxnats.Message},
		{"invalid subject", postboxnats.ErrInvalidSubject, postboxnats.Message},
		{"invalid header", postboxnats.ErrInvalidHeader, postboxnats.Message},
		{"no id", postboxnats.ErrNoID, postboxnats.Message},
		{"no stream, confirmed", wrap(postboxnats.ErrNoStream), postboxnats.Message},
		{"no stream response", jetstream.ErrNoStreamResponse, postboxnats.Unconfirmed},
		{"no responders", nats.ErrNoResponders, postboxnats.Unconfirmed},
		{"no responders, wrapped", wrap(nats.ErrNoResponders), postboxnats.Unconfirmed},
		{"stream max_msg_size", api(10054, "message size exceeds maximum allowed"), postboxnats.Message},
		{"stream max_msg_size, sentinel", jetstream.ErrStreamMessageExceedsMaximum, postboxnats.Message},
		{"header over 64k", api(10097, "header size exceeds maximum allowed of 64k"), postboxnats.Message},
		{"expected stream mismatch", wrap(api(10060, "expected stream does not match")), postboxnats.Message},
		{"sealed stream", api(10109, "invalid operation on sealed stream"), postboxnats.Message},
		{"file store record too large", api(10077, "message too large"), postboxnats.Message},
		{"stream full, discard new", api(10077, "maximum messages exceeded"), postboxnats.Infrastructure},
		{"stream bytes full", api(10077, "maximum bytes exceeded"), postboxnats.Infrastructure},
		{"insufficient resources", api(10023, "insufficient resources"), postboxnats.Infrastructure},
		{"duplicate in process", api(10158, "duplicate message id is in process"), postboxnats.Infrastructure},
		{"too many requests", api(10167, "too many requests"), postboxnats.Infrastructure},
		{"stream offline", api(10118, "stream is offline"), postboxnats.Infrastructure},
		{"jetstream not enabled", jetstream.ErrJetStreamNotEnabled, postboxnats.Infrastructure},
		{"ack timeout", jetstream.ErrAsyncPublishTimeout, postboxnats.Infrastructure},
		{"request timeout", nats.ErrTimeout, postboxnats.Infrastructure},
		{"disconnected", nats.ErrDisconnected, postboxnats.Infrastructure},
		{"connection closed", nats.ErrConnectionClosed, postboxnats.Infrastructure},
		{"jetstream: connection closed", jetstream.ErrConnectionClosed, postboxnats.Infrastructure},
		{"reconnect buffer full", nats.ErrReconnectBufExceeded, postboxnats.Infrastructure},
		{"invalid ack", jetstream.ErrInvalidJSAck, postboxnats.Infrastructure},
		{"publisher closed", postboxnats.ErrClosed, postboxnats.Infrastructure},
		{"client context closed", jetstream.ErrJetStreamPublisherClosed, postboxnats.Infrastructure},
		{"unknown", errors.New("something odd"), postboxnats.Infrastructure},
	} {
		if got := postboxnats.Classify(tc.err); got != tc.want {
			t.Errorf("%s: Classify(%v) = %s, want %s", tc.name, tc.err, got, tc.want)
		}
	}
}

func TestValidateSubject(t *testing.T) {
	for _, s := range []string{"a", "orders.created", "events.billing:invoice-paid_v2", "a.b.c.d.e", "ünïcode.ok", "$KV.bucket.key", "a*b.c>d"} {
		if err := postboxnats.ValidateSubject(s); err != nil {
			t.Errorf("ValidateSubject(%q) = %v, want nil", s, err)
		}
	}
	for _, s := range []string{"", ".a", "a.", "a..b", "*", "a.*", "a.>", ">", "a b", "a\tb", "a\r\nb", "a\x00b", "a\x7fb",
		"$JS.API.STREAM.DELETE.X", "$SYS.REQ.SERVER.PING", "$JSC.R.x", "$NRG.x", "\xff\xfe", strings.Repeat("a", postboxnats.MaxSubjectBytes+1)} {
		err := postboxnats.ValidateSubject(s)
		if !errors.Is(err, postboxnats.ErrInvalidSubject) {
			t.Errorf("ValidateSubject(%q) = %v, want ErrInvalidSubject", s, err)
		}
	}
}

func TestConfigDefaultsAndValidation(t *testing.T) {
	c := (*postboxnats.Config)(nil).WithDefaults()
	if c.PublishTimeout != postboxnats.DefaultPublishTimeout || c.MaxPending != postboxnats.DefaultMaxPending {
		t.Fatalf("defaults not applied: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	if postboxnats.DefaultPublishTimeout >= postbox.DefaultBatchDeadline {
		t.Fatalf("default publish timeout %s not under the relay's batch deadline %s", postboxnats.DefaultPublishTimeout, postbox.DefaultBatchDeadline)
	}
	for _, tc := range []struct {
		cfg   postboxnats.Config
		field string
	}{
		{postboxnats.Config{SubjectPrefix: "events"}, "SubjectPrefix"},
		{postboxnats.Config{SubjectPrefix: "a..b."}, "SubjectPrefix"},
		{postboxnats.Config{SubjectPrefix: "ev ents."}, "SubjectPrefix"},
		{postboxnats.Config{SubjectPrefix: "events.", Subject: func(s string) string { return s }}, "SubjectPrefix"},
		{postboxnats.Config{ExpectStream: "a b"}, "ExpectStream"},
		{postboxnats.Config{ExpectStream: "a\x01"}, "ExpectStream"},
		{postboxnats.Config{PublishTimeout: -1}, "PublishTimeout"},
		{postboxnats.Config{PublishTimeout: 24 * 60 * 60 * 1e9}, "PublishTimeout"},
		{postboxnats.Config{MaxPending: -5}, "MaxPending"},
		{postboxnats.Config{MaxPending: 1 << 30}, "MaxPending"},
	} {
		err := tc.cfg.WithDefaults().Validate()
		var ce *postbox.ConfigError
		if !errors.As(err, &ce) || len(ce.Problems) != 1 || ce.Problems[0].Field != tc.field {
			t.Errorf("%+v: got %v, want one problem in %s", tc.cfg, err, tc.field)
		}
	}
	ok := postboxnats.Config{SubjectPrefix: "events.", ExpectStream: "EVENTS"}
	if err := ok.WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
}
