package postboxkafka

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/configcheck"
)

// CloudEvents attributes travel as Kafka headers named "ce_" plus the
// attribute (the CloudEvents Kafka protocol binding, binary mode,
// §3.2.3.1); the envelope names them "ce-" plus the attribute.
const (
	ceKafkaPrefix  = "ce_"
	ceHeaderPrefix = "ce-"
)

// HeaderID is the Kafka header carrying the message id: the CloudEvents
// id attribute, ce_id.
const HeaderID = ceKafkaPrefix + "id"

// KafkaTopic returns the Kafka topic a postbox topic is published to, or
// an error wrapping ErrInvalidTopic. Applications can call it when they
// write a message, to refuse a topic this Publisher could never deliver
// before it reaches the outbox.
func (p *Publisher) KafkaTopic(topic string) (string, error) {
	var t string
	if p.cfg.Topic != nil {
		t = p.cfg.Topic(topic)
	} else {
		t = p.cfg.TopicPrefix + topic
	}
	if err := ValidateTopicName(t); err != nil {
		if t == topic {
			return "", fmt.Errorf("topic %q: %w", configcheck.Shorten(topic), err)
		}
		return "", fmt.Errorf("topic %q maps to %w", configcheck.Shorten(topic), err)
	}
	return t, nil
}

// record builds the Kafka record for env: the key is the message key (nil
// for a keyless message, which the partitioner spreads), the value is the
// payload (empty, never null: a null value is a tombstone on a compacted
// topic), the timestamp is now, and the headers are ce_id = env.ID, the
// CloudEvents attributes as ce_*, content-type, and the other headers as
// they are.
func (p *Publisher) record(env *postbox.Envelope, now time.Time) (*kgo.Record, error) {
	if env.ID == "" {
		return nil, ErrNoID
	}
	topic, err := p.KafkaTopic(env.Topic)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(env.Headers))
	for k := range env.Headers {
		if k != postbox.HeaderID {
			names = append(names, k)
		}
	}
	slices.Sort(names) // the same message always has the same headers, in the same order
	hs := make([]kgo.RecordHeader, 0, len(names)+1)
	hs = append(hs, kgo.RecordHeader{Key: HeaderID, Value: []byte(env.ID)})
	for _, k := range names {
		v := env.Headers[k]
		name, err := wireName(k)
		if err != nil {
			return nil, err
		}
		if !utf8.ValidString(v) {
			return nil, fmt.Errorf("%w %q: value is not UTF-8", ErrInvalidHeader, configcheck.Shorten(k))
		}
		hs = append(hs, kgo.RecordHeader{Key: name, Value: []byte(v)})
	}
	value := env.Payload
	if value == nil {
		value = []byte{}
	}
	r := &kgo.Record{Topic: topic, Value: value, Headers: hs, Timestamp: now}
	if env.Key != "" {
		r.Key = []byte(env.Key)
	}
	return r, nil
}

// wireName maps an envelope header to its Kafka header name: ce-X becomes
// ce_X, everything else keeps its name. A name that already starts with
// "ce_" would be read back as a CloudEvents attribute, so it is refused.
func wireName(name string) (string, error) {
	if rest, ok := strings.CutPrefix(name, ceHeaderPrefix); ok {
		return ceKafkaPrefix + rest, nil
	}
	if len(name) >= len(ceKafkaPrefix) && strings.EqualFold(name[:len(ceKafkaPrefix)], ceKafkaPrefix) {
		return "", fmt.Errorf("%w %q: names starting with %q carry CloudEvents attributes on Kafka", ErrInvalidHeader, configcheck.Shorten(name), ceKafkaPrefix)
	}
	if name == "" || !utf8.ValidString(name) {
		return "", fmt.Errorf("%w %q: names are non-empty UTF-8", ErrInvalidHeader, configcheck.Shorten(name))
	}
	return name, nil
}

// delivery turns a record into a postbox.Delivery: ce_X headers renamed
// ce-X, the others as they are; ID from ce_id, else the record's place
// (topic/partition/offset, stable for as long as the record exists); the
// topic from ce_type, else the Kafka topic; the key from ce_partitionkey,
// else the record key; Delivered is attempt, this subscriber's count.
func delivery(r *kgo.Record, attempt int) *postbox.Delivery {
	h := make(map[string]string, len(r.Headers))
	for _, kv := range r.Headers {
		k := kv.Key
		if rest, ok := strings.CutPrefix(k, ceKafkaPrefix); ok {
			k = ceHeaderPrefix + rest
		}
		h[k] = string(kv.Value)
	}
	d := &postbox.Delivery{
		ID: h[postbox.HeaderID], Topic: h[postbox.HeaderType], Key: h[postbox.HeaderPartitionKey],
		Payload: r.Value, Headers: h, Delivered: attempt,
	}
	if d.ID == "" {
		d.ID = fmt.Sprintf("kafka/%s/%d/%d", r.Topic, r.Partition, r.Offset)
	}
	if d.Topic == "" {
		d.Topic = r.Topic
	}
	if d.Key == "" && len(r.Key) > 0 {
		d.Key = string(r.Key)
	}
	return d
}

// CheckMessage implements postbox.MessageChecker: what Publish could
// never send is refused when the message is written. It builds the record
// as Publish does, so a topic this Publisher cannot map to a Kafka topic
// and a header Kafka cannot carry are refused; so is a record whose key,
// value and headers alone are over the client's ProducerBatchMaxBytes
// (kerr.MessageTooLarge). A record just under it, which its encoding takes
// over, or one over the topic's max.message.bytes, is dead at its first
// publish.
func (p *Publisher) CheckMessage(env *postbox.Envelope) error {
	rec, err := p.record(env, env.CreatedAt)
	if err != nil {
		return err
	}
	size := len(rec.Key) + len(rec.Value)
	for _, h := range rec.Headers {
		size += len(h.Key) + len(h.Value)
	}
	if most, ok := p.cl.OptValue(kgo.ProducerBatchMaxBytes).(int32); ok && most > 0 && size > int(most) {
		return fmt.Errorf("%w: key, value and headers take %d bytes, over the client's ProducerBatchMaxBytes of %d", kerr.MessageTooLarge, size, most)
	}
	return nil
}
