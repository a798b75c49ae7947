package postboxkafka

import (
	"github.com/twmb/franz-go/pkg/kgo"
)

// checkProducer lists the options of cl that would make an acknowledged
// produce worth less than postbox promises (docs/design.md §8), or that would
// create topology or reroute records behind the Publisher's back.
func checkProducer(cl *kgo.Client) problems {
	var ps problems
	if acks, _ := cl.OptValue(kgo.RequiredAcks).(kgo.Acks); acks != kgo.AllISRAcks() {
		ps.Add("client.RequiredAcks", "", "must be kgo.AllISRAcks() (acks=all, the default): with fewer acks, a broker lost after its acknowledgement loses the message")
	}
	if flag(cl, kgo.DisableIdempotentWrite) {
		ps.Add("client.DisableIdempotentWrite", "", "must not be set: without idempotence, a produce retried by the client can be stored twice or out of order")
	}
	if flag(cl, kgo.AllowIdempotentProduceCancellation) {
		ps.Add("client.AllowIdempotentProduceCancellation", "", "must not be set: it gives up idempotence for cancelled records; the Publisher stops waiting on its own and the client keeps the record's outcome")
	}
	ps = append(ps, checkCommon(cl)...)
	if v := cl.OptValues(kgo.TransactionalID); len(v) == 2 && v[1] == true {
		ps.Add("client.TransactionalID", v[0], "must not be set: the Publisher produces outside transactions")
	}
	if flag(cl, kgo.ManualFlushing) {
		ps.Add("client.ManualFlushing", "", "must not be set: records would wait for a Flush the Publisher never calls")
	}
	if flag(cl, kgo.DefaultProduceTopicAlways) {
		ps.Add("client.DefaultProduceTopicAlways", "", "must not be set: it sends every message to one topic whatever its own")
	}
	return ps
}

// checkCommon lists the options that must be off for any client of this
// package.
func checkCommon(cl *kgo.Client) problems {
	var ps problems
	if flag(cl, kgo.AllowAutoTopicCreation) {
		ps.Add("client.AllowAutoTopicCreation", "", "must not be set: topics are topology, made with EnsureTopic, never as a side effect of publishing or subscribing")
	}
	return ps
}

// checkConsumer lists the options of a Subscriber's client that conflict
// with how the Subscriber consumes.
func checkConsumer(cl *kgo.Client) problems {
	ps := checkCommon(cl)
	if flag(cl, kgo.ConsumeRegex) {
		ps.Add("client.ConsumeRegex", "", "must not be set: the Subscriber's topics are names, not patterns")
	}
	if v, _ := cl.OptValue(kgo.ConsumePartitions).(map[string]map[int32]kgo.Offset); len(v) > 0 {
		ps.Add("client.ConsumePartitions", "", "must not be set: the Subscriber consumes as a group member")
	}
	return ps
}

func flag(cl *kgo.Client, opt any) bool {
	b, _ := cl.OptValue(opt).(bool)
	return b
}
