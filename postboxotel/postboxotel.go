// Package postboxotel connects postbox to OpenTelemetry tracing.
//
//	tr := postboxotel.New(otel.GetTracerProvider(), propagation.TraceContext{})
//	client, _ := postbox.NewClient(driver, &postbox.Config{Publisher: pub, Tracer: tr}) // writer, relay and inbox
//
// A message written under a traced context stores the trace context in its
// headers (traceparent, tracestate). The relay's publish span is a new
// trace linked to the writer's: the relay's work is not part of the
// request that wrote the message, and may run long after it. The headers
// travel to the broker with the message, and the consumer's span is a child
// of the writer's span, so the trace reads writer → consumer, with the
// relay beside it.
package postboxotel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/postbox-go/postbox"
)

// Tracer implements postbox.Tracer.
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

var (
	_ postbox.Tracer      = (*Tracer)(nil)
	_ postbox.BatchTracer = (*Tracer)(nil)
)

// New returns a Tracer on tp, carrying context with prop (usually
// propagation.TraceContext{}, or a composite with baggage).
func New(tp trace.TracerProvider, prop propagation.TextMapPropagator) *Tracer {
	return &Tracer{tracer: tp.Tracer("github.com/postbox-go/postbox"), prop: prop}
}

// Inject implements postbox.Tracer.
func (t *Tracer) Inject(ctx context.Context, headers map[string]string) {
	t.prop.Inject(ctx, propagation.MapCarrier(headers))
}

func messageAttrs(id, topic, key string) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		attribute.String("messaging.message.id", id),
		attribute.String("messaging.destination.name", topic),
	}
	if key != "" {
		attrs = append(attrs, attribute.String("messaging.message.conversation_id", key))
	}
	return attrs
}

// StartPublish implements postbox.Tracer.
func (t *Tracer) StartPublish(ctx context.Context, env *postbox.Envelope) func(error) {
	writer := trace.SpanContextFromContext(t.prop.Extract(context.Background(), propagation.MapCarrier(env.Headers)))
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(append(messageAttrs(env.ID, env.Topic, env.Key),
			attribute.String("messaging.operation.type", "send"),
			attribute.Int("postbox.attempt", env.Attempt))...),
	}
	if writer.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: writer}))
	}
	_, span := t.tracer.Start(ctx, "postbox publish "+env.Topic, opts...)
	return func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
			span.SetAttributes(attribute.Bool("postbox.message_failure", postbox.IsMessageError(err)))
		}
		span.End()
	}
}

// StartHandle implements postbox.Tracer.
func (t *Tracer) StartHandle(ctx context.Context, consumer string, d *postbox.Delivery) (context.Context, func(postbox.Verdict)) {
	ctx = t.prop.Extract(ctx, propagation.MapCarrier(d.Headers))
	ctx, span := t.tracer.Start(ctx, "postbox process "+d.Topic,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(append(messageAttrs(d.ID, d.Topic, d.Key),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.consumer.group.name", consumer),
			attribute.Int("messaging.message.delivery_count", d.Delivered))...))
	return ctx, func(v postbox.Verdict) {
		span.SetAttributes(attribute.String("postbox.verdict", v.Action.String()), attribute.Bool("postbox.duplicate", v.Duplicate))
		if v.Err != nil {
			span.RecordError(v.Err)
			span.SetStatus(codes.Error, v.Err.Error())
		}
		span.End()
	}
}

// StartBatch implements postbox.BatchTracer. A batch's span, "postbox
// process batch", starts a trace of its own, as the batch is part of no
// one delivery's trace, and links to each delivery's span; it carries the
// deliveries' count and, once ended, how the batch ended
// (postbox.batch.outcome) and its copies. A batch whose transaction failed
// (the outcome one_by_one) ends in error.
func (t *Tracer) StartBatch(ctx context.Context, consumer string, deliveries []context.Context) (context.Context, func(*postbox.InboxBatchReport)) {
	links := make([]trace.Link, 0, len(deliveries))
	for _, d := range deliveries {
		if sc := trace.SpanContextFromContext(d); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	ctx, span := t.tracer.Start(ctx, "postbox process batch",
		trace.WithNewRoot(),
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(links...),
		trace.WithAttributes(
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.consumer.group.name", consumer),
			attribute.Int("messaging.batch.message_count", len(deliveries))))
	return ctx, func(r *postbox.InboxBatchReport) {
		span.SetAttributes(attribute.String("postbox.batch.outcome", r.Outcome.String()), attribute.Int("postbox.batch.copies", r.Copies))
		if r.Outcome == postbox.BatchOneByOne {
			span.SetStatus(codes.Error, "the batch's transaction failed; its deliveries were processed one by one")
		}
		span.End()
	}
}
