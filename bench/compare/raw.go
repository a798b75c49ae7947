package compare

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
)

// raw measures the broker alone: the same payloads, each with its own
// Nats-Msg-Id (made before the clock starts, as the outbox makes its ids at
// write time), published straight to a stream.
func (r *run) raw(ctx context.Context, res *Result) error {
	name := "BENCH_CMP_RAW_" + r.tag
	prefix := "bench.cmp.raw." + r.tag
	drop, err := r.stream(ctx, name, prefix+".>")
	if err != nil {
		return err
	}
	defer drop()

	n := r.opts.Messages
	ids := make([]string, n+r.opts.SyncSample)
	for i := range ids {
		ids[i] = postbox.NewID()
	}

	// Asynchronous, with the relay's window: docs/design.md §6's baseline.
	fmt.Fprintf(r.out, "raw JetStream: %d async publishes of %d bytes, window %d\n", n, r.opts.PayloadBytes, r.opts.Window)
	ajs, err := jetstream.New(r.nc, jetstream.WithPublishAsyncMaxPending(r.opts.Window))
	if err != nil {
		return err
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		msg := nats.NewMsg(prefix + ".a")
		msg.Data = r.payload
		for {
			_, err := ajs.PublishMsgAsync(msg, jetstream.WithMsgID(ids[i]))
			if err == nil {
				break
			}
			// A window that stays full for a while is back-pressure,
			// not failure.
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				return fmt.Errorf("async publish: %w", err)
			}
		}
	}
	select {
	case <-ajs.PublishAsyncComplete():
	case <-ctx.Done():
		return ctx.Err()
	}
	res.RawRate = float64(n) / time.Since(start).Seconds()
	fmt.Fprintf(r.out, "raw JetStream: async %.0f msg/s\n", res.RawRate)

	// Synchronous, one ack at a time: the ceiling of any forwarder that
	// waits for each ack before the next publish, as Watermill's
	// JetStream publisher does.
	start = time.Now()
	for i := 0; i < r.opts.SyncSample; i++ {
		msg := nats.NewMsg(prefix + ".s")
		msg.Data = r.payload
		if _, err := r.js.PublishMsg(ctx, msg, jetstream.WithMsgID(ids[n+i])); err != nil {
			return fmt.Errorf("sync publish: %w", err)
		}
	}
	res.RawSyncRate = float64(r.opts.SyncSample) / time.Since(start).Seconds()
	fmt.Fprintf(r.out, "raw JetStream: sync %.0f msg/s (%d messages)\n", res.RawSyncRate, r.opts.SyncSample)

	got, err := r.streamMsgs(ctx, name)
	if err != nil {
		return err
	}
	if got != n+r.opts.SyncSample {
		return fmt.Errorf("raw stream holds %d messages, want %d", got, n+r.opts.SyncSample)
	}
	return nil
}
