package postboxamqp

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/configcheck"
	"github.com/postbox-go/postbox/internal/printable"
)

// ceAMQPPrefix names CloudEvents attributes in AMQP application
// properties (the CloudEvents AMQP protocol binding, binary mode, §3.1.3.1);
// the binding allows "cloudEvents_" too, which readers accept.
const (
	ceAMQPPrefix    = "cloudEvents:"
	ceAMQPAltPrefix = "cloudEvents_"
	ceHeaderPrefix  = "ce-"
)

// deliveryCountHeader is the count a quorum queue adds to a redelivered
// message: the deliveries before this one.
const deliveryCountHeader = "x-delivery-count"

// reservedHeaders steer RabbitMQ rather than describe the message: CC and
// BCC add routing keys (sender-selected distribution), x-delay defers the
// message under the delayed-message plugin, and the x-death family and
// x-delivery-count are the broker's own bookkeeping.
var reservedHeaders = map[string]bool{
	"cc": true, "bcc": true, "x-delay": true, "x-death": true, deliveryCountHeader: true,
	"x-first-death-exchange": true, "x-first-death-queue": true, "x-first-death-reason": true,
	"x-last-death-exchange": true, "x-last-death-queue": true, "x-last-death-reason": true,
}

// ceWireNames holds the AMQP names of the CloudEvents attributes postbox
// itself sets (the relay on every message, a writer when given a
// subject), made once rather than for each message.
var ceWireNames = func() map[string]string {
	m := map[string]string{}
	for _, name := range []string{postbox.HeaderSpecVersion, postbox.HeaderID, postbox.HeaderType, postbox.HeaderSource,
		postbox.HeaderSubject, postbox.HeaderTime, postbox.HeaderPartitionKey} {
		m[name] = ceAMQPPrefix + strings.TrimPrefix(name, ceHeaderPrefix)
	}
	return m
}()

// wireName maps an envelope header to its AMQP header name: ce-X becomes
// cloudEvents:X, everything else keeps its name. ce reports the former:
// no such name is one RabbitMQ reserves.
func wireName(name string) (wire string, ce bool) {
	if w, ok := ceWireNames[name]; ok {
		return w, true
	}
	if rest, ok := strings.CutPrefix(name, ceHeaderPrefix); ok {
		return ceAMQPPrefix + rest, true
	}
	return name, false
}

// routingKey maps a topic to its routing key, checked.
func (p *Publisher) routingKey(topic string) (string, error) {
	rk := topic
	if p.cfg.RoutingKey != nil {
		rk = p.cfg.RoutingKey(topic)
	}
	switch {
	case len(rk) > maxShortString:
		return "", fmt.Errorf("%w for topic %q: %d bytes, over AMQP's limit of %d", ErrInvalidRoutingKey, configcheck.Shorten(topic), len(rk), maxShortString)
	case !utf8.ValidString(rk):
		return "", fmt.Errorf("%w for topic %q: not UTF-8", ErrInvalidRoutingKey, configcheck.Shorten(topic))
	}
	return rk, nil
}

// publishing builds the AMQP message for env: persistent, message-id =
// env.ID, content-type from the content-type header, the CloudEvents
// attributes as cloudEvents:* headers, the other headers as they are,
// timestamp = env.CreatedAt, type = env.Topic. It also returns the size
// the content header frame will take, checked against frame_max by the
// caller.
func (p *Publisher) publishing(env *postbox.Envelope) (amqp.Publishing, int, error) {
	var m amqp.Publishing
	if env.ID == "" {
		return m, 0, ErrNoID
	}
	if len(env.ID) > maxShortString {
		return m, 0, fmt.Errorf("%w: message id is %d bytes, over AMQP's limit of %d", ErrInvalidHeader, len(env.ID), maxShortString)
	}
	if len(env.Topic) > maxShortString {
		return m, 0, fmt.Errorf("%w: topic %q is %d bytes, over AMQP's limit of %d for the type property", ErrInvalidHeader, configcheck.Shorten(env.Topic), len(env.Topic), maxShortString)
	}
	if len(env.Payload) > p.cfg.MaxMessageSize {
		return m, 0, fmt.Errorf("%w: payload is %d bytes, over MaxMessageSize %d", ErrTooLarge, len(env.Payload), p.cfg.MaxMessageSize)
	}
	// The content header frame: frame overhead 8, class, weight, body
	// size and property flags 14, then each property set.
	size := 8 + 14 + 1 + (1 + len(env.ID)) + 8 + (1 + len(env.Topic)) + 4
	table := make(amqp.Table, len(env.Headers))
	for k, v := range env.Headers {
		if k == postbox.HeaderContentType {
			if len(v) > maxShortString {
				return m, 0, fmt.Errorf("%w %q: %d bytes, over AMQP's limit of %d for content-type", ErrInvalidHeader, k, len(v), maxShortString)
			}
			m.ContentType = v
			size += 1 + len(v)
			continue
		}
		name, ce := wireName(k)
		switch {
		case name == "" || len(name) > maxShortString || !printable.Line(name):
			return m, 0, fmt.Errorf("%w %q: names are 1 to %d bytes of printable text", ErrInvalidHeader, configcheck.Shorten(k), maxShortString)
		case !ce && reservedHeaders[strings.ToLower(name)]:
			return m, 0, fmt.Errorf("%w %q: it steers RabbitMQ and only the broker sets it", ErrInvalidHeader, configcheck.Shorten(k))
		case !utf8.ValidString(v):
			return m, 0, fmt.Errorf("%w %q: value is not UTF-8", ErrInvalidHeader, configcheck.Shorten(k))
		}
		table[name] = v
		size += 1 + len(name) + 1 + 4 + len(v)
	}
	m.Headers = table
	m.DeliveryMode = amqp.Persistent
	m.MessageId = env.ID
	m.Timestamp = env.CreatedAt
	m.Type = env.Topic
	m.Body = env.Payload
	return m, size, nil
}

// delivery turns an AMQP delivery into a postbox.Delivery: ID from
// message-id (else cloudEvents:id), the headers flattened to strings with
// cloudEvents:X (or cloudEvents_X) renamed ce-X and the content-type
// property as content-type, the topic from ce-type (else the type
// property, else the routing key), the key from ce-partitionkey, and
// Delivered from a quorum queue's x-delivery-count.
func delivery(d *amqp.Delivery) *postbox.Delivery {
	h := make(map[string]string, len(d.Headers)+1)
	delivered := 0
	for k, v := range d.Headers {
		if k == deliveryCountHeader {
			if n, ok := toInt(v); ok && n >= 0 {
				delivered = n + 1
			}
			continue
		}
		s, ok := flatten(v)
		if !ok {
			continue // tables and arrays (x-death): broker bookkeeping
		}
		switch {
		case strings.HasPrefix(k, ceAMQPPrefix):
			k = ceHeaderPrefix + k[len(ceAMQPPrefix):]
		case strings.HasPrefix(k, ceAMQPAltPrefix):
			k = ceHeaderPrefix + k[len(ceAMQPAltPrefix):]
		}
		h[k] = s
	}
	if d.ContentType != "" {
		h[postbox.HeaderContentType] = d.ContentType
	}
	if delivered == 0 && !d.Redelivered {
		// A first delivery, whatever the queue type: quorum queues add
		// their count only from the second delivery on. A redelivery from
		// a classic queue carries no count, and stays 0 (unknown).
		delivered = 1
	}
	out := &postbox.Delivery{
		ID: d.MessageId, Key: h[postbox.HeaderPartitionKey], Payload: d.Body, Headers: h, Delivered: delivered,
		Redelivered: d.Redelivered,
	}
	if out.ID == "" {
		out.ID = h[postbox.HeaderID]
	}
	switch {
	case h[postbox.HeaderType] != "":
		out.Topic = h[postbox.HeaderType]
	case d.Type != "":
		out.Topic = d.Type
	default:
		out.Topic = d.RoutingKey
	}
	return out
}

func flatten(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case []byte:
		return string(x), true
	case bool:
		return strconv.FormatBool(x), true
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano), true
	case int8, int16, int32, int64, int, uint8, uint16, uint32, uint64:
		return fmt.Sprint(x), true
	case float32:
		return strconv.FormatFloat(float64(x), 'g', -1, 32), true
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64), true
	case amqp.Decimal:
		return fmt.Sprint(x), true
	}
	return "", false
}

func toInt(v any) (int, bool) {
	switch x := v.(type) {
	case int64:
		return int(x), true
	case int32:
		return int(x), true
	case int16:
		return int(x), true
	case int8:
		return int(x), true
	case int:
		return x, true
	case uint8:
		return int(x), true
	case uint16:
		return int(x), true
	case uint32:
		return int(x), true
	case uint64:
		return int(x), true
	}
	return 0, false
}
