package postboxnats

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/configcheck"
	"github.com/postbox-go/postbox/internal/pubkit"
)

// Errors this package reports as the cause of a message failure. The
// Publisher wraps them with postbox.NewMessageError; errors.Is finds them
// through that wrapper.
var (
	// ErrNoStream means the server confirmed that no stream captures the
	// message's subject. It is only reported after a stream lookup: a
	// publish that merely got no answer may have met a stream that is
	// electing a leader or a JetStream that is starting up.
	ErrNoStream = errors.New("postboxnats: no stream captures the subject")
	// ErrInvalidSubject means the topic mapped to a subject NATS cannot
	// publish on.
	ErrInvalidSubject = errors.New("postboxnats: invalid subject")
	// ErrInvalidHeader means a header cannot travel as a NATS header, or
	// is a reserved Nats-* header that would steer JetStream.
	ErrInvalidHeader = errors.New("postboxnats: invalid header")
	// ErrNoID means the envelope carries no message id, so JetStream could
	// not deduplicate its retries.
	ErrNoID = errors.New("postboxnats: envelope has no message id")
)

// ErrClosed is the infrastructure failure of publishes cut off by Close,
// and of every Publish after it.
var ErrClosed = errors.New("postboxnats: publisher closed")

// messageAPIErrors are the JetStream error codes, returned in a PubAck, that
// are caused by the message and would be returned again for the same
// message: retrying it soon cannot help, so it must spend an attempt
// rather than stall the relay. Every other API error (insufficient
// resources, stream offline, too many requests, a full stream with
// DiscardNew, a duplicate still in process) is a state of the server that
// passes, and counts as infrastructure.
var messageAPIErrors = map[jetstream.ErrorCode]bool{
	10060: true, // expected stream does not match (Nats-Expected-Stream)
	10109: true, // invalid operation on sealed stream
	10070: true, // wrong last msg ID
	10071: true, // wrong last sequence
	10164: true, // wrong last sequence (replicated streams)
	10165: true, // invalid per-message TTL
	10166: true, // per-message TTL is disabled
	10168: true, // message counters disabled
	10169: true, // message counter increment missing
	10170: true, // message counter has payload
	10171: true, // message counter increment invalid
	10172: true, // message counter broken
	10177: true, // atomic publish: unsupported header
	10188: true, // message schedules disabled
	10189: true, // message schedule pattern invalid
	10190: true, // message schedule target invalid
	10191: true, // message schedule TTL invalid
	10192: true, // message schedule rollup invalid
	10203: true, // message schedule source invalid
	10212: true, // message schedule scheduler invalid
	10223: true, // message schedule time zone invalid
	10227: true, // stream source header not allowed
}

// permanentAPIErrors are the message's faults among them that no retry
// and no later state of the stream short of a new configuration can cure:
// the message is too large for it. The relay buries such a message at
// once (postbox.Permanent).
var permanentAPIErrors = map[jetstream.ErrorCode]bool{
	10054: true, // message size exceeds maximum allowed (stream max_msg_size)
	10097: true, // header size exceeds maximum allowed of 64k
}

// storeFailed is JSStreamStoreFailedF: "message too large" (over the
// file store's record limit) is the message's fault, the rest of this
// code's causes (maximum messages or bytes with DiscardNew) are the
// stream's state.
const storeFailed jetstream.ErrorCode = 10077

// classify tells how err, returned by a JetStream publish, counts for
// the relay. err must not be nil.
//
//   - pubkit.Permanent: what the server can never accept from this
//     message: ErrInvalidSubject, ErrInvalidHeader, ErrNoID,
//     nats.ErrMaxPayload (payload and headers over the server's
//     max_payload), nats.ErrBadSubject, nats.ErrBadHeaderMsg,
//     jetstream.ErrInvalidSubject; and the JetStream API errors in a PubAck
//     that say it is too large (over the stream's max_msg_size, headers
//     over 64 KiB, over the file store's record limit).
//   - pubkit.Message: what pubkit.MessageFault knows as the message's
//     (postbox.MessageError); ErrNoStream; and the other JetStream API
//     errors in a PubAck that the message causes (expected stream
//     mismatch, sealed stream, ...).
//   - pubkit.Unconfirmed (a stream lookup settles it): jetstream.ErrNoStreamResponse and
//     nats.ErrNoResponders.
//   - pubkit.Infra: everything else: context errors, timeouts
//     (jetstream.ErrAsyncPublishTimeout, nats.ErrTimeout), nats.ErrDisconnected,
//     nats.ErrConnectionClosed, jetstream.ErrJetStreamNotEnabled, ErrClosed,
//     and unknown errors.
func classify(err error) pubkit.Fault {
	if postbox.IsPermanent(err) {
		return pubkit.Permanent
	}
	for _, c := range [...]error{ErrInvalidSubject, ErrInvalidHeader, ErrNoID, nats.ErrMaxPayload, nats.ErrBadSubject,
		nats.ErrBadHeaderMsg, jetstream.ErrInvalidSubject} {
		if errors.Is(err, c) {
			return pubkit.Permanent
		}
	}
	if message, known := pubkit.MessageFault(err, ErrNoStream); known {
		if message {
			return pubkit.Message
		}
		return pubkit.Infra
	}
	if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
		return pubkit.Unconfirmed
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		if permanentAPIErrors[api.ErrorCode] {
			return pubkit.Permanent
		}
		if messageAPIErrors[api.ErrorCode] {
			return pubkit.Message
		}
		if api.ErrorCode == storeFailed && strings.Contains(api.Description, "message too large") {
			return pubkit.Permanent
		}
	}
	return pubkit.Infra
}

// MaxSubjectBytes caps a subject's length. A publish's subject travels in
// the protocol's control line, which the server limits (4 KiB by default)
// and answers, when exceeded, by closing the connection: every message in
// flight would fail with it, so an overlong subject is refused here as the
// one message's fault.
const MaxSubjectBytes = 1024

// reservedSubjectPrefixes are the server's API and system namespaces. A
// message published there is a command (delete a stream, purge it), not a
// message, whatever a Subject function returns.
var reservedSubjectPrefixes = []string{"$JS.", "$JSC.", "$SYS.", "$NRG."}

// ValidateSubject reports whether subject can carry a message: 1 to
// MaxSubjectBytes bytes of UTF-8 without whitespace or control
// characters, dot-separated tokens that are not empty and not the
// wildcards * and >, and outside the server's $JS, $JSC, $SYS and $NRG
// namespaces. The error wraps ErrInvalidSubject.
func ValidateSubject(subject string) error {
	return validateSubject(subject)
}

func validateSubject(s string) error {
	bad := func(reason string) error {
		return fmt.Errorf("%w %q: %s", ErrInvalidSubject, configcheck.Shorten(s), reason)
	}
	if s == "" {
		return bad("it is empty")
	}
	if len(s) > MaxSubjectBytes {
		return bad(fmt.Sprintf("it is %d bytes, over the limit of %d", len(s), MaxSubjectBytes))
	}
	start := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) {
			c := s[i]
			if c <= ' ' || c == 0x7f {
				return bad(fmt.Sprintf("it has %q at byte %d; whitespace and control characters are not allowed", c, i))
			}
			if c != '.' {
				continue
			}
		}
		switch tok := s[start:i]; tok {
		case "":
			return bad("it has an empty token (a leading, trailing or doubled dot)")
		case "*", ">":
			return bad("it has the wildcard " + tok + "; a message needs a literal subject")
		}
		start = i + 1
	}
	if !utf8.ValidString(s) {
		return bad("it is not valid UTF-8")
	}
	if s[0] == '$' {
		for _, p := range reservedSubjectPrefixes {
			if strings.HasPrefix(s, p) {
				return bad("it is in the server's " + strings.TrimSuffix(p, ".") + " namespace")
			}
		}
	}
	return nil
}

// validateHeader checks one envelope header. Names are printable ASCII
// without ':' (the NATS header syntax); values must not hold CR or LF,
// which the client would otherwise rewrite into spaces without a word.
// Nats-* names are refused: Nats-Msg-Id, Nats-Expected-*, Nats-Rollup,
// Nats-TTL and the rest steer JetStream, and only the Publisher sets them.
func validateHeader(name, value string) error {
	if name == "" {
		return fmt.Errorf("%w: empty header name", ErrInvalidHeader)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x21 || c > 0x7e || c == ':' {
			return fmt.Errorf("%w %q: name has %q; names are printable ASCII without ':'", ErrInvalidHeader, configcheck.Shorten(name), c)
		}
	}
	if len(name) >= 5 && name[0]|0x20 == 'n' && strings.EqualFold(name[:5], "nats-") {
		return fmt.Errorf("%w %q: Nats-* headers steer JetStream and are set by the publisher only", ErrInvalidHeader, configcheck.Shorten(name))
	}
	return validateHeaderValue(name, value)
}

func validateHeaderValue(name, value string) error {
	// A byte loop: these three bytes never occur inside a multi-byte UTF-8
	// sequence, and strings.ContainsAny costs every header of every
	// message several times as much.
	for i := 0; i < len(value); i++ {
		if c := value[i]; c == '\r' || c == '\n' || c == 0 {
			return fmt.Errorf("%w %q: value holds CR, LF or NUL", ErrInvalidHeader, configcheck.Shorten(name))
		}
	}
	return nil
}
