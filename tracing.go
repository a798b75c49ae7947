package postbox

import "context"

// Tracer connects postbox to a tracing system without the core depending
// on one; postboxotel implements it for OpenTelemetry. Set it in
// Config.Tracer (writer, relay and inbox).
//
// The trace context travels as message headers (W3C traceparent and
// tracestate): stored with the row at write time, copied to the broker by
// every publisher, read back by the consumer.
type Tracer interface {
	// Inject adds the trace context of ctx to a message's headers at write
	// time.
	Inject(ctx context.Context, headers map[string]string)
	// StartPublish starts the relay's span for publishing env, linked to
	// the writer's trace found in env.Headers, and returns the function
	// that ends it with the publish's outcome.
	StartPublish(ctx context.Context, env *Envelope) func(err error)
	// StartHandle starts the consumer's span for d, continuing the trace
	// found in d.Headers, and returns the context the handler runs in and
	// the function that ends the span with the verdict.
	StartHandle(ctx context.Context, consumer string, d *Delivery) (context.Context, func(v Verdict))
}

// BatchTracer is an optional extension of Tracer: when Config.Tracer
// implements it, a batch processor (Inbox.BatchProcessor,
// Inbox.BatchHandlerProcessor) starts a span for each batch of more than
// one delivery, beside the deliveries' own spans (StartHandle), which keep
// their verdicts. postboxotel implements it.
type BatchTracer interface {
	// StartBatch starts the span of one batch of consumer's deliveries,
	// linked to the spans the deliveries' contexts hold (one a first copy,
	// from StartHandle, in the batch's order), and returns the context the
	// batch's transactions and a BatchHandler run in, and the function
	// that ends the span with the batch's report.
	StartBatch(ctx context.Context, consumer string, deliveries []context.Context) (context.Context, func(r *InboxBatchReport))
}
