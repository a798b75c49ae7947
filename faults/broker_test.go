//go:build faults

package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxamqp"
	"github.com/postbox-go/postbox/postboxnats"
)

// broker is what the harness needs of the broker under test: a server of
// the run's own that the faults can stop and start, the relays' route to
// it, the consumer's subscriber, and a watcher's independent reading of
// everything it stored, in the order it stored it.
type broker interface {
	// name is "nats" or "rabbitmq"; where names the stream or queue.
	name() string
	where() string
	// addr is host:port of the server, for the proxy in front of it.
	addr() string
	// relayConfig is the broker's part of the relays' YAML, and relayEnv
	// the environment that points them at proxy (host:port).
	relayConfig() string
	relayEnv(proxy string) []string
	// consumerVars tell the consumer process (consumerSubscriber) how to
	// subscribe, on a connection of its own.
	consumerVars() map[string]string
	// watch reads every stored copy into w until ctx ends.
	watch(ctx context.Context, w *watcher) error
	// caughtUp reports whether w has read everything stored so far.
	caughtUp(ctx context.Context, w *watcher) bool
	// stop and start the server (a clean stop; the store survives).
	stop() error
	start(ctx context.Context) error
	// perKeyDelivery: the subscriber promises per-key order, so the
	// checker holds the effects to it (apply_order).
	perKeyDelivery() bool
}

// natsBroker is a nats-server of the run's own with one JetStream stream.
type natsBroker struct {
	srv    *natsServer
	urls   string // the servers, comma-separated
	nc     *nats.Conn
	js     jetstream.JetStream
	stream string
	subj   string // subject prefix, "fx<run>."
}

func newNATSBroker(t *testing.T, ctx context.Context, dir, run string, dupWindow time.Duration) *natsBroker {
	t.Helper()
	b := &natsBroker{srv: startNATS(t, ctx, dir), stream: "FX" + run, subj: "fx" + run + "."}
	b.urls = b.srv.url()
	var err error
	b.nc, err = nats.Connect(b.urls, nats.Name("postbox faults harness"), nats.MaxReconnects(-1), nats.PingInterval(2*time.Second), nats.MaxPingsOutstanding(3))
	if err != nil {
		t.Fatalf("NATS at %s: %v", b.srv.url(), err)
	}
	t.Cleanup(b.nc.Close)
	if b.js, err = jetstream.New(b.nc); err != nil {
		t.Fatal(err)
	}
	if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: b.stream, Subjects: []string{b.subj + ">"}, Storage: jetstream.FileStorage,
		Duplicates: dupWindow, MaxAge: 2 * time.Hour,
	}); err != nil {
		t.Fatalf("create stream %s: %v", b.stream, err)
	}
	return b
}

func (b *natsBroker) name() string  { return "nats" }
func (b *natsBroker) where() string { return "stream " + b.stream }
func (b *natsBroker) addr() string  { return strings.TrimPrefix(b.srv.url(), "nats://") }

func (b *natsBroker) relayConfig() string {
	return fmt.Sprintf("nats:\n  subject_prefix: %q\n", b.subj)
}

func (b *natsBroker) relayEnv(proxy string) []string {
	return []string{"POSTBOX_NATS_URL=nats://" + proxy}
}

func (b *natsBroker) consumerVars() map[string]string {
	return map[string]string{"url": b.urls, "stream": b.stream, "subj": b.subj}
}

// consumerSubscriber is the consumer process's subscriber to the broker
// brokerName named, as vars (broker.consumerVars) say, and what closes
// its connection. ackWait is JetStream's (profile.AckWait); RabbitMQ
// returns a dead consumer's deliveries when its connection ends.
func consumerSubscriber(ctx context.Context, kind string, vars map[string]string, ackWait time.Duration, log *slog.Logger) (postbox.Subscriber, func(), error) {
	if kind == "rabbitmq" {
		sub, err := postboxamqp.NewSubscriber(postboxamqp.URL(vars["url"]), vars["queue"], &postboxamqp.SubscriberConfig{PerKey: true, Logger: log})
		return sub, func() {}, err
	}
	nc, err := nats.Connect(vars["url"], nats.Name("postbox faults consumer"), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		// A node cut off by the network is noticed within about 6 s, as the
		// relay does; nats.go's defaults would wait 4 min.
		nats.PingInterval(2*time.Second), nats.MaxPingsOutstanding(3))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	cons, err := postboxnats.EnsureConsumer(ctx, js, vars["stream"], jetstream.ConsumerConfig{
		Durable: natsConsumerName, AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1,
		AckWait: ackWait, MaxAckPending: 20_000,
	})
	var stream jetstream.Stream
	if err == nil {
		stream, err = js.Stream(ctx, vars["stream"])
	}
	if err == nil {
		var sub postbox.Subscriber
		sub, err = postboxnats.NewSubscriber(cons, &postboxnats.SubscriberConfig{PerKey: true, Stream: stream, SubjectPrefix: vars["subj"], Logger: log})
		if err == nil {
			return sub, nc.Close, nil
		}
	}
	nc.Close()
	return nil, nil, err
}

// watch reads the stream from the start with an ordered consumer, on the
// harness's own connection (not through the proxy).
func (b *natsBroker) watch(ctx context.Context, w *watcher) error {
	cons, err := b.js.OrderedConsumer(ctx, b.stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return err
	}
	// A pull request the cluster lost (its consumer's node killed or
	// cut off) is noticed only by a missed heartbeat, whose timer each
	// Next call starts again: so Next waits for as long as the watch
	// lasts, and a short heartbeat makes the ordered consumer start over
	// within two of them.
	it, err := cons.Messages(jetstream.PullHeartbeat(time.Second))
	if err != nil {
		return err
	}
	defer it.Stop()
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return err
			}
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		meta, err := msg.Metadata()
		if err != nil {
			continue
		}
		s := seen{StreamSeq: meta.Sequence.Stream, MsgID: msg.Headers().Get(jetstream.MsgIDHeader), Subject: msg.Subject(), Stored: meta.Timestamp}
		_ = json.Unmarshal(msg.Data(), &s.P)
		w.add(s)
	}
}

// natsConsumerName is the consumer process's durable JetStream consumer.
const natsConsumerName = "fxconsumer"

// describer is a broker that can say where its stream and consumer stand,
// for a run that did not settle.
type describer interface {
	describe(ctx context.Context) string
}

func (b *natsBroker) describe(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := b.js.Stream(ctx, b.stream)
	if err != nil {
		return "stream: " + err.Error()
	}
	out := fmt.Sprintf("stream last seq %d, %d messages", s.CachedInfo().State.LastSeq, s.CachedInfo().State.Msgs)
	c, err := s.Consumer(ctx, natsConsumerName)
	if err != nil {
		return out + "; consumer: " + err.Error()
	}
	ci := c.CachedInfo()
	leader := ""
	if ci.Cluster != nil {
		leader = ci.Cluster.Leader
	}
	return out + fmt.Sprintf("; consumer leader %q delivered stream %d consumer %d, ack floor stream %d consumer %d, ack pending %d, redelivered %d, waiting pulls %d, pending %d",
		leader, ci.Delivered.Stream, ci.Delivered.Consumer, ci.AckFloor.Stream, ci.AckFloor.Consumer, ci.NumAckPending, ci.NumRedelivered, ci.NumWaiting, ci.NumPending)
}

func (b *natsBroker) caughtUp(ctx context.Context, w *watcher) bool {
	s, err := b.js.Stream(ctx, b.stream)
	if err != nil {
		return false
	}
	info, err := s.Info(ctx)
	return err == nil && w.last() >= info.State.LastSeq
}

func (b *natsBroker) stop() error                     { return b.srv.stop(10 * time.Second) }
func (b *natsBroker) start(ctx context.Context) error { return b.srv.start(ctx) }
func (b *natsBroker) perKeyDelivery() bool            { return true }

// poolerName is what stands between the processes and PostgreSQL:
// POSTBOX_FAULTS_POOLER, empty (nothing, the default) or pgbouncer.
func poolerName() (string, error) {
	switch v := os.Getenv("POSTBOX_FAULTS_POOLER"); v {
	case "", "none":
		return "", nil
	case "pgbouncer":
		return v, nil
	default:
		return "", fmt.Errorf("POSTBOX_FAULTS_POOLER=%q: want pgbouncer or none", v)
	}
}

// brokerName is the broker under test: POSTBOX_FAULTS_BROKER, nats (the
// default), nats-cluster (three nodes, a stream of three replicas) or
// rabbitmq.
func brokerName() (string, error) {
	switch v := os.Getenv("POSTBOX_FAULTS_BROKER"); v {
	case "", "nats":
		return "nats", nil
	case "rabbitmq", "nats-cluster":
		return v, nil
	default:
		return "", fmt.Errorf("POSTBOX_FAULTS_BROKER=%q: want nats, nats-cluster or rabbitmq", v)
	}
}
