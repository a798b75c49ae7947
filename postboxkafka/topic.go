package postboxkafka

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ErrTopicMismatch means EnsureTopic found the topic with a partition
// count or replication factor other than the one asked for. Neither is
// changed in place: adding partitions moves keys to other partitions
// (breaking their order while both hold messages), and a new replication
// factor needs a reassignment an operator plans.
var ErrTopicMismatch = errors.New("postboxkafka: topic exists with other settings")

// EnsureTopic creates topic with the given partitions, replication factor
// and topic configs, or, when it exists, checks its partitions and
// replication factor and sets configs on it. It is the explicit topology
// step: run it at deploy or start-up (every replica may; it is
// idempotent), never per publish. Publishing and subscribing create
// nothing, and a message for a topic that does not exist fails with
// ErrNoTopic.
//
// partitions and replicationFactor may be -1 for the broker's defaults
// (num.partitions, default.replication.factor); an existing topic is then
// not checked for that setting. For durable acknowledgements use a
// replication factor of at least 3 with min.insync.replicas of at least 2
// (see the package documentation); for example:
//
//	err := postboxkafka.EnsureTopic(ctx, cl, "orders", 12, 3, map[string]string{
//		"min.insync.replicas":            "2",
//		"unclean.leader.election.enable": "false",
//		"message.timestamp.type":         "CreateTime",
//		"retention.ms":                   "604800000",
//	})
func EnsureTopic(ctx context.Context, cl *kgo.Client, topic string, partitions int32, replicationFactor int16, configs map[string]string) error {
	if cl == nil {
		return errors.New("postboxkafka: EnsureTopic needs a *kgo.Client")
	}
	if err := ValidateTopicName(topic); err != nil {
		return fmt.Errorf("postboxkafka: ensure topic: %w", err)
	}
	if partitions == 0 || partitions < -1 {
		return fmt.Errorf("postboxkafka: ensure topic %s: partitions is %d; want at least 1, or -1 for the broker's default", topic, partitions)
	}
	if replicationFactor == 0 || replicationFactor < -1 {
		return fmt.Errorf("postboxkafka: ensure topic %s: replication factor is %d; want at least 1, or -1 for the broker's default", topic, replicationFactor)
	}
	req := kmsg.NewPtrCreateTopicsRequest()
	req.TimeoutMillis = requestTimeout(ctx)
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic = topic
	rt.NumPartitions = partitions
	rt.ReplicationFactor = replicationFactor
	for _, k := range slices.Sorted(maps.Keys(configs)) {
		c := kmsg.NewCreateTopicsRequestTopicConfig()
		c.Name = k
		c.Value = kmsg.StringPtr(configs[k])
		rt.Configs = append(rt.Configs, c)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("postboxkafka: create topic %s: %w", topic, err)
	}
	if len(resp.Topics) != 1 {
		return fmt.Errorf("postboxkafka: create topic %s: the broker answered for %d topics", topic, len(resp.Topics))
	}
	t := resp.Topics[0]
	switch err := kerr.ErrorForCode(t.ErrorCode); {
	case err == nil:
		return nil
	case errors.Is(err, kerr.TopicAlreadyExists):
		return ensureExisting(ctx, cl, topic, partitions, replicationFactor, configs)
	default:
		return fmt.Errorf("postboxkafka: create topic %s: %w%s", topic, err, detail(t.ErrorMessage))
	}
}

// ensureExisting checks an existing topic against the partitions and
// replication factor asked for, and sets configs on it.
func ensureExisting(ctx context.Context, cl *kgo.Client, topic string, partitions int32, replicationFactor int16, configs map[string]string) error {
	n, rf, err := describeTopic(ctx, cl, topic)
	if err != nil {
		return fmt.Errorf("postboxkafka: ensure topic %s: %w", topic, err)
	}
	if partitions > 0 && n != int(partitions) {
		return fmt.Errorf("%w: %s has %d partitions, want %d; change it deliberately (new partitions move keys, breaking their order while both hold messages)", ErrTopicMismatch, topic, n, partitions)
	}
	if replicationFactor > 0 && rf != int(replicationFactor) {
		return fmt.Errorf("%w: %s has replication factor %d, want %d; change it with a partition reassignment", ErrTopicMismatch, topic, rf, replicationFactor)
	}
	if len(configs) == 0 {
		return nil
	}
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeTopic
	res.ResourceName = topic
	for _, k := range slices.Sorted(maps.Keys(configs)) {
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name = k
		c.Op = kmsg.IncrementalAlterConfigOpSet
		c.Value = kmsg.StringPtr(configs[k])
		res.Configs = append(res.Configs, c)
	}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("postboxkafka: set configs of topic %s: %w", topic, err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return fmt.Errorf("postboxkafka: set configs of topic %s: %w%s", topic, err, detail(r.ErrorMessage))
		}
	}
	return nil
}

// topicMissing asks the cluster for topic's metadata, creating nothing,
// and reports whether the cluster says the topic does not exist.
func topicMissing(ctx context.Context, cl *kgo.Client, topic string) (bool, error) {
	t, err := metadata(ctx, cl, topic)
	if err != nil {
		return false, err
	}
	switch err := kerr.ErrorForCode(t.ErrorCode); {
	case err == nil:
		return false, nil
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		return true, nil
	default:
		return false, err
	}
}

// describeTopic returns topic's partition count and replication factor
// (the least over its partitions).
func describeTopic(ctx context.Context, cl *kgo.Client, topic string) (partitions, rf int, err error) {
	t, err := metadata(ctx, cl, topic)
	if err != nil {
		return 0, 0, err
	}
	if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			return 0, 0, fmt.Errorf("%w: %s", ErrNoTopic, topic)
		}
		return 0, 0, err
	}
	rf = -1
	for _, p := range t.Partitions {
		if rf < 0 || len(p.Replicas) < rf {
			rf = len(p.Replicas)
		}
	}
	return len(t.Partitions), max(rf, 0), nil
}

func metadata(ctx context.Context, cl *kgo.Client, topic string) (*kmsg.MetadataResponseTopic, error) {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	req.AllowAutoTopicCreation = false
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	for i := range resp.Topics {
		if t := &resp.Topics[i]; t.Topic != nil && *t.Topic == topic {
			return t, nil
		}
	}
	return nil, fmt.Errorf("the metadata response has no entry for topic %s", topic)
}

// TopicReport is what CheckTopic found about a topic's durability.
type TopicReport struct {
	Topic string
	// Partitions is the partition count.
	Partitions int
	// ReplicationFactor is the least replica count over the partitions.
	ReplicationFactor int
	// Configs holds the topic's effective configs as the broker reports
	// them (its own defaults included).
	Configs map[string]string
	// Problems names each setting that makes an acknowledged message worth
	// less than postbox promises, or that can delete messages before they
	// are consumed. Empty when none was found.
	Problems []string
}

// CheckTopic reads topic's partitions, replicas and configs and reports
// the settings that weaken what an acknowledgement is worth (docs/design.md §8):
// a replication factor under 3, min.insync.replicas under 2 or not under
// the replication factor, unclean leader election, compaction (which
// keeps only a key's latest message), a message.timestamp.type other
// than CreateTime or LogAppendTime, and a max.message.bytes under the
// client's ProducerBatchMaxBytes (the broker then refuses whole batches,
// blaming every message in them). It returns ErrNoTopic when the topic
// does not exist. Run it at start-up and log the problems; it changes
// nothing.
func CheckTopic(ctx context.Context, cl *kgo.Client, topic string) (*TopicReport, error) {
	if cl == nil {
		return nil, errors.New("postboxkafka: CheckTopic needs a *kgo.Client")
	}
	n, rf, err := describeTopic(ctx, cl, topic)
	if err != nil {
		return nil, fmt.Errorf("postboxkafka: check topic %s: %w", topic, err)
	}
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeTopic
	res.ResourceName = topic
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("postboxkafka: check topic %s: describe configs: %w", topic, err)
	}
	rep := &TopicReport{Topic: topic, Partitions: n, ReplicationFactor: rf, Configs: map[string]string{}}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return nil, fmt.Errorf("postboxkafka: check topic %s: describe configs: %w%s", topic, err, detail(r.ErrorMessage))
		}
		for _, c := range r.Configs {
			if c.Value != nil {
				rep.Configs[c.Name] = *c.Value
			}
		}
	}
	rep.Problems = durabilityProblems(rep, cl)
	return rep, nil
}

func durabilityProblems(rep *TopicReport, cl *kgo.Client) []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if rep.ReplicationFactor < 3 {
		add("replication factor %d: an acknowledged message survives the loss of a broker only with 3 or more", rep.ReplicationFactor)
	}
	if v, ok := rep.Configs["min.insync.replicas"]; ok {
		isr, err := strconv.Atoi(v)
		switch {
		case err != nil:
		case isr < 2:
			add("min.insync.replicas %d: acks=all is then satisfied by the leader alone, whose loss loses the message; use 2 or more", isr)
		case isr >= rep.ReplicationFactor:
			add("min.insync.replicas %d with replication factor %d: losing one replica stops every write; keep it under the replication factor", isr, rep.ReplicationFactor)
		}
	}
	if rep.Configs["unclean.leader.election.enable"] == "true" {
		add("unclean.leader.election.enable is true: an out-of-sync replica can become leader and drop acknowledged messages")
	}
	if strings.Contains(rep.Configs["cleanup.policy"], "compact") {
		add("cleanup.policy %q: compaction keeps only the latest message of each key, deleting ones not yet consumed", rep.Configs["cleanup.policy"])
	}
	if v, ok := rep.Configs["message.timestamp.type"]; ok && v != "CreateTime" && v != "LogAppendTime" {
		add("message.timestamp.type %q: want CreateTime (the record's timestamp is its publish time) or LogAppendTime", v)
	}
	if v, ok := rep.Configs["max.message.bytes"]; ok {
		mb, err := strconv.Atoi(v)
		batch, _ := cl.OptValue(kgo.ProducerBatchMaxBytes).(int32)
		if err == nil && batch > 0 && mb < int(batch) {
			add("max.message.bytes %d is under the client's ProducerBatchMaxBytes %d: the broker can refuse a batch of small messages whole, failing each one; lower ProducerBatchMaxBytes to it", mb, batch)
		}
	}
	return out
}

// requestTimeout is the broker-side timeout for an admin request: what is
// left of ctx, or 30s.
func requestTimeout(ctx context.Context) int32 {
	d := 30 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		d = max(time.Until(dl), time.Millisecond)
	}
	return int32(min(d, time.Minute).Milliseconds())
}

func detail(msg *string) string {
	if msg == nil || *msg == "" {
		return ""
	}
	return ": " + *msg
}
